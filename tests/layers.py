"""Reading a package's layers from its modules' own import statements, so that the picture a
package's docstrings draw cannot drift from the code.

Python modules are read with ast; Cython sources (.pyx, .pxd) by their `import`/`cimport`
lines, which is all their import syntax needs.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

CYTHON_SUFFIXES = (".pyx", ".pxd")
CYTHON_IMPORT = re.compile(
    r"^\s*(?:from\s+([\w.]+)\s+c?import\s+\(?([\w\s,]+?)\)?|c?import\s+([\w.]+))\s*(?:#.*)?$",
    re.M,
)


def layer_of(module: str) -> str:
    """'controlplane.rules.room' -> 'rules'; 'controlplane.server' -> 'server'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path, root: Path) -> str:
    relative = path.relative_to(root.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(package: str, level: int, module: str | None) -> str:
    if not level:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([module] if module else []))


def _python_imports(path: Path, package: str) -> set[tuple[str, tuple[str, ...]]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(package, node.level, node.module)
            found.add((target, tuple(alias.name for alias in node.names)))
    return found


def _cython_imports(path: Path) -> set[tuple[str, tuple[str, ...]]]:
    found = set()
    for source, names, plain in CYTHON_IMPORT.findall(path.read_text()):
        if plain:
            found.add((plain, ()))
        else:
            found.add((source, tuple(n.split()[0] for n in names.split(",") if n.strip())))
    return found


def imported(path: Path, root: Path) -> set[str]:
    """Every module or package of the package at `root` that `path` imports."""
    top = root.name
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if path.suffix in CYTHON_SUFFIXES:
        statements = _cython_imports(path)
    else:
        statements = _python_imports(path, package)
    found: set[str] = set()
    for target, names in statements:
        if target == top:  # `from controlplane import rules`
            found.update(f"{top}.{name}" for name in names)
        else:
            found.add(target)
    return {name for name in found if name.startswith(f"{top}.")}


def upward_imports(root: Path, may_import: Callable[[str, str], bool]) -> list[str]:
    """'a.b (own) imports c.d (theirs)' for each import that `may_import(own, theirs)` refuses."""
    wrong = []
    patterns = ("*.py", *(f"*{suffix}" for suffix in CYTHON_SUFFIXES))
    sources = [path for pattern in patterns for path in root.rglob(pattern)]
    for path in sorted(sources):
        module = module_name(path, root)
        if module == root.name:
            continue
        own = layer_of(module)
        for target in sorted(imported(path, root)):
            theirs = layer_of(target)
            if not may_import(own, theirs):
                wrong.append(f"{module} ({own}) imports {target} ({theirs})")
    return wrong

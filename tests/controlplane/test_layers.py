"""The control plane's folders are its layers: a module imports only the layers below its own.

Read from every module's own import statements (ast), so the picture in
controlplane/__init__.py cannot drift from the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "controlplane"

# From the bottom up; a module may import its own layer and those listed before it.
LAYERS = ["vocabulary", "rules", "state", "views", "tick", "api", "server"]
# A process of its own beside the layers, and what it may import.
AGENT_MAY_IMPORT = {"vocabulary", "agent"}


def layer_of(module: str) -> str:
    """'controlplane.rules.room' -> 'rules'; 'controlplane.server' -> 'server'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path, root: Path = PACKAGE) -> str:
    relative = path.relative_to(root.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, root: Path = PACKAGE) -> set[str]:
    """Every controlplane module or package that `path` imports, absolute or relative."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "controlplane":  # `from controlplane import rules`
                found.update(f"controlplane.{alias.name}" for alias in node.names)
            else:
                found.add(target)
    return {name for name in found if name.startswith("controlplane.")}


def upward_imports(root: Path = PACKAGE) -> list[str]:
    wrong = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        own = layer_of(module)
        if module == "controlplane":
            continue
        for target in sorted(imported(path, root)):
            theirs = layer_of(target)
            if own == "agent":
                allowed = theirs in AGENT_MAY_IMPORT
            else:
                allowed = theirs in LAYERS and LAYERS.index(theirs) <= LAYERS.index(own)
            if not allowed:
                wrong.append(f"{module} ({own}) imports {target} ({theirs})")
    return wrong


def test_every_module_sits_in_a_layer():
    loose = [
        path.name
        for path in PACKAGE.glob("*.py")
        if path.name not in ("__init__.py", "server.py")
    ]
    assert loose == []
    rooms = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert rooms == set(LAYERS[:-1]) | {"agent"}


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports() == []


def test_every_room_says_what_it_holds_and_may_import():
    for room in [*LAYERS[:-1], "agent"]:
        doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), room


@pytest.mark.parametrize(
    ("room", "line"),
    [
        ("rules", "from controlplane.state.fleet import Fleet\n"),
        ("vocabulary", "from controlplane.rules import placement\n"),
        ("agent", "from controlplane.state.orders import Orders\n"),
        ("views", "import controlplane.tick.reconciler\n"),
    ],
)
def test_an_upward_import_is_caught(tmp_path, room, line):
    copy = tmp_path / "controlplane"
    (copy / room).mkdir(parents=True)
    (copy / room / "__init__.py").write_text('"""A room."""\n')
    (copy / room / "upward.py").write_text(line)
    assert upward_imports(copy) == [
        f"controlplane.{room}.upward ({room}) imports {line.split()[1]} "
        f"({line.split()[1].split('.')[1]})"
    ]

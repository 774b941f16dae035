"""The router's folders are its rooms: a module imports only the rooms below its own.

Read from every module's own import and cimport statements, so the picture in
router/__init__.py cannot drift from the code; the compiled modules' .pxd files count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import layers

PACKAGE = Path(__file__).resolve().parents[2] / "router"

# From the bottom up; a module may import its own room and those listed before it.
ROOMS = ["protocol", "load", "control", "tenancy", "telemetry", "path"]
# The process around the rooms, at the top: these may import any room and each other.
PROCESS = {"server", "main", "__main__", "listen", "sdnotify", "credentials"}
# Below everything: which implementation (compiled or its twin) a module gets.
SWITCH = "compiled"


def may_import(own: str, theirs: str) -> bool:
    if theirs == SWITCH:
        return True
    if own in PROCESS:
        return theirs in ROOMS or theirs in PROCESS
    return theirs in ROOMS and own in ROOMS and ROOMS.index(theirs) <= ROOMS.index(own)


def upward_imports(root: Path = PACKAGE) -> list[str]:
    return layers.upward_imports(root, may_import)


def test_every_module_sits_in_a_room():
    loose = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", SWITCH} - PROCESS
    assert loose == set()
    assert not list(PACKAGE.glob("*.pyx")) and not list(PACKAGE.glob("*.pxd"))
    rooms = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert rooms == set(ROOMS)


def test_no_module_imports_a_room_above_its_own():
    assert upward_imports() == []


def test_every_room_says_what_it_holds_and_may_import():
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), room


@pytest.mark.parametrize(
    ("room", "name", "line", "target"),
    [
        ("protocol", "upward.py", "from router.path import fastpath\n", "router.path"),
        ("control", "upward.py", "import router.tenancy.tenants\n", "router.tenancy.tenants"),
        ("tenancy", "upward.pxd", "from router.path.context cimport ProxyContext\n",
         "router.path.context"),
        ("load", "upward.pyx", "from router cimport server\n", "router.server"),
    ],
)
def test_an_upward_import_is_caught(tmp_path, room, name, line, target):
    copy = tmp_path / "router"
    (copy / room).mkdir(parents=True)
    (copy / room / "__init__.py").write_text('"""A room."""\n')
    (copy / room / name).write_text(line)
    module = f"router.{room}.{name.partition('.')[0]}"
    assert upward_imports(copy) == [
        f"{module} ({room}) imports {target} ({target.split('.')[1]})"
    ]

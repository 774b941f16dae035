"""The control plane's folders are its layers: a module imports only the layers below its own.

Read from every module's own import statements (ast), so the picture in
controlplane/__init__.py cannot drift from the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import layers

PACKAGE = Path(__file__).resolve().parents[2] / "controlplane"

# From the bottom up; a module may import its own layer and those listed before it.
LAYERS = ["vocabulary", "rules", "state", "views", "tick", "api", "server"]
# A process of its own beside the layers, and what it may import.
AGENT_MAY_IMPORT = {"vocabulary", "agent"}


def may_import(own: str, theirs: str) -> bool:
    if own == "agent":
        return theirs in AGENT_MAY_IMPORT
    return theirs in LAYERS and LAYERS.index(theirs) <= LAYERS.index(own)


def upward_imports(root: Path = PACKAGE) -> list[str]:
    return layers.upward_imports(root, may_import)


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

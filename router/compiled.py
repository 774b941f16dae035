"""Which router modules are compiled, and the switch that runs them as plain Python.

The modules named here are ordinary Python source, typed by the `.pxd` file beside each, and
setup.py compiles each one into an extension module of the same name, which Python imports in
place of the `.py`. With `GPUROUTER_NO_EXTENSIONS=1` the router imports the `.py` files
instead (and the pure-Python twin of the endpoint table): the same code, interpreted, for
debugging, for profiling in Python terms, and for the benchmark that measures what compiling
wins.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

COMPILED_MODULES = (
    "router.telemetry.metrics",
    "router.protocol.sink",
    "router.path.target",
    "router.path.affinity",
    "router.tenancy.tenants",
    "router.path.sender",
    "router.path.upstream",
    "router.path.context",
    "router.path.exchange",
    "router.path.front",
)
HERE = Path(__file__).resolve().parent


def extensions_disabled() -> bool:
    return os.environ.get("GPUROUTER_NO_EXTENSIONS") == "1"


class SourceOnly(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' `.py` files, ahead of the extensions beside them."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in COMPILED_MODULES:
            return None
        source = HERE.parent / (fullname.replace(".", "/") + ".py")
        return importlib.util.spec_from_file_location(fullname, source)


def install_switch() -> None:
    if extensions_disabled() and not any(isinstance(f, SourceOnly) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceOnly())


def implementation(extension: str, twin):
    """The compiled module `extension` unless the switch is on or it was not built (a source
    checkout), in which case its pure-Python `twin`, which has the same API."""
    if extensions_disabled():
        return twin
    try:
        return importlib.import_module(extension)
    except ImportError:
        return twin


def is_compiled(module) -> bool:
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)

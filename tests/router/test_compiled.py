"""The compiled request path and its switch: `make` builds every module that router.compiled
names, GPUROUTER_NO_EXTENSIONS=1 runs the same source interpreted, and the in-process tests of
the request path pass both ways."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.compiled import COMPILED_MODULES

ROOT = Path(__file__).resolve().parents[2]
REPORT = (
    "import importlib, router.compiled as c, router.path.fastpath as f, router.protocol.wire as w\n"
    "names = c.COMPILED_MODULES\n"
    "print(f.USING_EXTENSION, w.USING_EXTENSION,\n"
    "      *[c.is_compiled(importlib.import_module(n)) for n in names])\n"
)


def imported(switch: str) -> list[str]:
    env = {**os.environ, "GPUROUTER_NO_EXTENSIONS": switch}
    done = subprocess.run(
        [sys.executable, "-c", REPORT], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("switch, compiled", [("0", True), ("1", False)])
def test_the_switch_picks_the_extensions_or_their_source(switch, compiled):
    assert imported(switch) == [str(compiled)] * (2 + len(COMPILED_MODULES))


def test_every_extension_is_built_from_the_source_beside_it():
    """An extension older than its .py or .pxd would run code that is no longer there."""
    for name in (*COMPILED_MODULES, "router.path._fastpath", "router.protocol._wire"):
        stem = ROOT / name.replace(".", "/")
        built = list(stem.parent.glob(stem.name + ".cpython-*.so"))
        assert built, f"{name} is not compiled: run make"
        suffixes = (".py", ".pyx", ".pxd")
        sources = [s for s in map(stem.with_suffix, suffixes) if s.exists()]
        newest_source = max(s.stat().st_mtime for s in sources)
        assert built[0].stat().st_mtime >= newest_source, f"{built[0].name} is stale: run make"


def test_the_request_path_tests_pass_interpreted_too():
    """The compiled modules' own tests, run again on the interpreted source."""
    env = {**os.environ, "GPUROUTER_NO_EXTENSIONS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/router/test_exchange.py",
            "tests/router/test_forwarding.py",
            "tests/router/test_upstream_reuse.py",
            "tests/router/test_affinity.py",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout

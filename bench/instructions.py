"""Machine instructions per proxied request, counted by valgrind: exact where timings on a
shared machine are not (run to run they agree within about half a percent).

    python -m bench.instructions [--affinity off] [--tree DIR] [--interpreted]

`--tree` measures another checkout (a `git worktree` of an older commit, with the extension
built or copied in), so that a change can be compared with what it replaced; a router older
than affinity routes by least in flight, as `--affinity off` does. `--interpreted` counts the
same source run as `GPUROUTER_NO_EXTENSIONS=1` runs it. The count for N requests minus the
count for fewer leaves out start-up and imports.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROGRAM = """
import inspect, sys
from bench.proxy_inprocess import run
options = (sys.argv[2],) if "affinity" in inspect.signature(run).parameters else ()
run(200, *options)  # warm up: first-call caches, the pool's connection
run(int(sys.argv[1]), *options)
"""

HERE = Path(__file__).resolve().parents[1]
FEW, MANY = 300, 1300


def instructions(tree: Path, requests: int, affinity: str, interpreted: bool = False) -> int:
    return callgrind(tree, PROGRAM, [str(requests), affinity], interpreted)


def callgrind(tree: Path, program: str, args: list[str], interpreted: bool = False) -> int:
    """Instructions `python -c program *args` runs in `tree`, start-up included."""
    # A fixed hash seed: dict and set layouts, and so the count, are the same run to run.
    env = {k: v for k, v in os.environ.items() if k != "GPUROUTER_NO_EXTENSIONS"}
    env["PYTHONHASHSEED"] = "0"
    if interpreted:
        env["GPUROUTER_NO_EXTENSIONS"] = "1"
    with tempfile.TemporaryDirectory() as scratch:
        completed = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={scratch}/out",
                sys.executable,
                "-c",
                program,
                *args,
            ],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", completed.stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no count:\n{completed.stderr[-2000:]}")
    return int(found.group(1))


def per_request(
    tree: Path = HERE, affinity: str = "prefix", interpreted: bool = False, pool=None
) -> float:
    """Instructions per proxied request: two counts, run side by side on `pool` if given."""

    def count(requests: int) -> int:
        return instructions(tree, requests, affinity, interpreted)

    few, many = (pool.map if pool else map)(count, (FEW, MANY))
    return (many - few) / (MANY - FEW)


def compiled_and_interpreted(affinity: str = "prefix") -> tuple[float, float]:
    """(compiled, interpreted) instructions per request of this checkout's request path."""
    with ThreadPoolExecutor(2) as pool:
        compiled = per_request(HERE, affinity, False, pool)
        interpreted = per_request(HERE, affinity, True, pool)
    return compiled, interpreted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--affinity", default="prefix", choices=["off", "session", "prefix"])
    parser.add_argument("--tree", type=Path, default=HERE)
    parser.add_argument("--interpreted", action="store_true")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    with ThreadPoolExecutor(2) as pool:
        count = per_request(args.tree.resolve(), args.affinity, args.interpreted, pool)
    build = "interpreted" if args.interpreted else "compiled"
    print(f"{count:,.0f} instructions per proxied request ({args.tree}, {build})")


if __name__ == "__main__":
    main()

"""Machine instructions per proxied request, counted by valgrind: exact where timings on a
shared machine are not (run to run they agree within about half a percent).

    python -m bench.instructions [--affinity off] [--tree DIR]

`--tree` measures another checkout (a `git worktree` of an older commit, with the extension
built or copied in), so that a change can be compared with what it replaced; a router older
than affinity routes by least in flight, as `--affinity off` does. The count for
N requests minus the count for fewer leaves out start-up and imports.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = """
import inspect, sys
from bench.proxy_inprocess import run
options = (sys.argv[2],) if "affinity" in inspect.signature(run).parameters else ()
run(200, *options)  # warm up: first-call caches, the pool's connection
run(int(sys.argv[1]), *options)
"""


def instructions(tree: Path, requests: int, affinity: str) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        completed = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={scratch}/out",
                sys.executable,
                "-c",
                PROGRAM,
                str(requests),
                affinity,
            ],
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", completed.stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no count:\n{completed.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--affinity", default="prefix", choices=["off", "session", "prefix"])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    few, many = 1000, 5000
    per_request = (
        instructions(args.tree, many, args.affinity) - instructions(args.tree, few, args.affinity)
    ) / (many - few)
    print(f"{per_request:,.0f} instructions per proxied request ({args.tree})")


if __name__ == "__main__":
    main()

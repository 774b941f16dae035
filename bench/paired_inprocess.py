"""`bench.proxy_inprocess` for this checkout and another one, in one process, run by run in turn:
the paired ratio is steadier than two separate runs on a shared machine.

    python -m bench.paired_inprocess --tree ../old [--pairs 30] [--requests 5000]

`--tree` is a checkout of another commit (a `git worktree`, with the extension built or
copied in). Both trees' `router` and `bench` packages are imported side by side under their own
names, so each run uses its own code. A router older than affinity routes by least in flight,
so this checkout runs with `--affinity off` unless `--affinity` says otherwise.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "bench")


def load_run(tree: Path, interpreted: bool = False):
    """`run` of the tree's bench.proxy_inprocess, imported apart from any other tree's; with
    `interpreted`, as `GPUROUTER_NO_EXTENSIONS=1` imports it (the compiled modules' source)."""
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        del sys.modules[name]
    # By name: each load imports router.compiled afresh, so the finder's class is not one object.
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "SourceOnly"]
    if interpreted:
        os.environ["GPUROUTER_NO_EXTENSIONS"] = "1"
    sys.path.insert(0, str(tree))
    try:
        from bench.proxy_inprocess import run
    finally:
        sys.path.remove(str(tree))
        os.environ.pop("GPUROUTER_NO_EXTENSIONS", None)
    return run


def alternate(first, second, pairs: int, requests: int, first_options=(), second_options=()):
    """Seconds per request of `first` and of `second`, run by run in turn, after a warm-up."""
    first(requests, *first_options), second(requests, *second_options)
    firsts, seconds = [], []
    for _ in range(pairs):
        firsts.append(first(requests, *first_options))
        seconds.append(second(requests, *second_options))
    return firsts, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--affinity", default="off", choices=["off", "session", "prefix"])
    args = parser.parse_args()
    other, this = load_run(args.tree.resolve()), load_run(HERE)
    other_options = (args.affinity,) if "affinity" in inspect.signature(other).parameters else ()
    theirs, ours = alternate(
        other, this, args.pairs, args.requests, other_options, (args.affinity,)
    )
    ratios = sorted(b / a for a, b in zip(theirs, ours, strict=True))
    for name, times in ((str(args.tree), theirs), ("this checkout", ours)):
        print(
            f"{name:>30}: min {min(times) * 1e6:.2f} µs, "
            f"median {statistics.median(times) * 1e6:.2f} µs per request"
        )
    print(
        f"this/other, median of {args.pairs} pairs: {statistics.median(ratios):.3f} "
        f"(pairs from {ratios[0]:.3f} to {ratios[-1]:.3f})"
    )


if __name__ == "__main__":
    main()

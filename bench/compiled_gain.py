"""What compiling the request path wins: `bench.proxy_inprocess` on the compiled modules and on
the same source interpreted (`GPUROUTER_NO_EXTENSIONS=1`), run by run in turn in one process.

    python -m bench.compiled_gain [--pairs 31] [--requests 3000] [--json]

Both builds of the router are imported side by side: the interpreted one first, through the
switch that `GPUROUTER_NO_EXTENSIONS=1` sets, then the compiled one; each run uses its own.
Each run is timed on the CPU time of its thread. The figure is the median of the per-pair
ratios (interpreted time / compiled time), which the drift of a shared machine moves far less
than either time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import orjson

from bench import paired_inprocess

HERE = Path(__file__).resolve().parents[1]


def load_run(compiled: bool):
    """`run` of bench.proxy_inprocess over the compiled router modules or over their source."""
    run = paired_inprocess.load_run(HERE, interpreted=not compiled)
    from router import compiled as switch
    from router.path import fastpath, front

    if switch.is_compiled(front) != compiled or fastpath.USING_EXTENSION != compiled:
        raise RuntimeError(
            "the compiled router modules are not built (python setup.py build_ext --inplace)"
            if compiled
            else "the source of the router modules could not be imported"
        )
    return run


def measure(pairs: int, requests: int) -> dict:
    # CPU time of this thread: what the other processes of a shared machine take is left out.
    options = ("prefix", time.thread_time)
    slow, fast = paired_inprocess.alternate(
        load_run(compiled=False), load_run(compiled=True), pairs, requests, options, options
    )
    ratios = sorted(s / f for s, f in zip(slow, fast, strict=True))
    return {
        "interpreted_us": statistics.median(slow) * 1e6,
        "compiled_us": statistics.median(fast) * 1e6,
        "ratio": statistics.median(ratios),
        "lowest_pair": ratios[0],
        "highest_pair": ratios[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=31)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = measure(args.pairs, args.requests)
    if args.json:
        print(orjson.dumps(figures).decode())
        return
    print(
        f"interpreted {figures['interpreted_us']:.2f} µs, compiled {figures['compiled_us']:.2f} µs"
        f" per request (medians); interpreted/compiled, median of {args.pairs} pairs:"
        f" {figures['ratio']:.2f} (pairs from {figures['lowest_pair']:.2f}"
        f" to {figures['highest_pair']:.2f})"
    )


if __name__ == "__main__":
    main()

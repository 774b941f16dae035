"""Machine instructions per loop of the fast path's calls, counted by valgrind in a fresh
process (fixed hash seed): the same every run, where the timed loops of a few milliseconds
moved with each process's memory layout (a keyed gate read 1.6 to 2.2 against its bar).

    python -m bench.loop_instructions

Loops: `plain` is acquire+release by least in flight, `keyed` the same with an affinity key;
each `_floor` is the same two calls into the extension doing nothing (`EndpointTable.noop`).
The count for N loops minus the count for fewer leaves out start-up and imports.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from bench.instructions import HERE, callgrind

PROGRAM = """
import sys
from router.path import _fastpath
table = _fastpath.EndpointTable()
table.update({"model-0": [(f"m0-r{r}", f"http://127.0.0.1:{9000 + r}") for r in range(4)]})
(model,) = list(table.models())
acquire, release, noop, key = table.acquire, table.release, table.noop, 0x6B43A9B5
loop, n = sys.argv[1], int(sys.argv[2])
if loop == "plain":
    for _ in range(n):
        release(acquire(model))
elif loop == "plain_floor":
    for _ in range(n):
        noop(noop(model))
elif loop == "keyed":
    for _ in range(n):
        release(acquire(model, key))
elif loop == "keyed_floor":
    for _ in range(n):
        noop(noop(model, key))
"""
FEW, MANY = 2_000, 22_000
LOOPS = ("plain", "plain_floor", "keyed", "keyed_floor")


def per_loop(pool: ThreadPoolExecutor) -> dict[str, float]:
    """Instructions per loop of each of LOOPS."""
    runs = {
        (loop, n): pool.submit(callgrind, HERE, PROGRAM, [loop, str(n)])
        for loop in LOOPS
        for n in (FEW, MANY)
    }
    return {
        loop: (runs[(loop, MANY)].result() - runs[(loop, FEW)].result()) / (MANY - FEW)
        for loop in LOOPS
    }


def main() -> None:
    with ThreadPoolExecutor(2) as pool:
        counts = per_loop(pool)
    for loop in ("plain", "keyed"):
        work, floor = counts[loop], counts[f"{loop}_floor"]
        print(f"{loop}: {work:.0f} instructions a loop, floor {floor:.0f}: {work / floor:.2f}x")


if __name__ == "__main__":
    main()

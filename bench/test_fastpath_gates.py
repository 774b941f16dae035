"""Perf gates of the fast path: each compares two things in the same run and gates on the ratio."""

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench import loop_instructions
from bench.figures import record
from bench.timing import paired
from router.path import _fastpath, fastpath_py

LOOPS = 10_000
# The floor gates count instructions (bench.loop_instructions): acquire+release measured 1.40x
# the same calls doing nothing, keyed 1.43x, the same every run. Timed, the keyed loop read
# 1.6 to 2.2 from one process to the next (its memory layout, not its code), against a bar of
# 2.0. The bar sits about 12% over the counts: an allocation or a Python call on the path
# costs more than that. The timed ratio is still reported, and is the gate (at 2.0) where
# valgrind is not installed.
MAX_FLOOR_INSTRUCTIONS = 1.6
MAX_FLOOR_TIME = 2.0


@pytest.fixture(scope="module")
def loop_counts():
    """Instructions per loop of the fast path's calls, or None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    with ThreadPoolExecutor(2) as pool:
        return loop_instructions.per_loop(pool)


def within_floor(name: str, timed_ratio: float, counts) -> None:
    if counts is None:
        record(f"{name}: valgrind not installed, gated on the timed ratio")
        assert timed_ratio <= MAX_FLOOR_TIME
        return
    ratio = counts[name] / counts[f"{name}_floor"]
    record(
        f"{name} acquire+release instructions a loop: {counts[name]:.0f}, the floor"
        f" {counts[f'{name}_floor']:.0f}, ratio {ratio:.2f}"
    )
    assert ratio <= MAX_FLOOR_INSTRUCTIONS, counts


def table_with(module, models: int, per_model: int = 4):
    table = module.EndpointTable()
    table.update(
        {
            f"model-{m}": [(f"m{m}-r{r}", f"http://127.0.0.1:{9000 + r}") for r in range(per_model)]
            for m in range(models)
        }
    )
    return table


def acquire_release_loop(table, model="model-0"):
    # Everything the loop touches is a fast local, as in the floor's loop below, so that the
    # two loops differ only in what the extension does.
    def run(acquire=table.acquire, release=table.release, model=model):
        for _ in range(LOOPS):
            release(acquire(model))

    return run


def report(benchmark, name, **figures):
    benchmark.extra_info.update(figures)
    record(f"{name}: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()))


def test_cython_is_at_least_8x_the_twin(benchmark):
    fast = acquire_release_loop(table_with(_fastpath, 1))
    slow = acquire_release_loop(table_with(fastpath_py, 1))
    python_ns, cython_ns, ratio = paired(slow, fast, LOOPS, rounds=15)
    report(
        benchmark,
        "acquire+release ns/op",
        cython=cython_ns,
        python=python_ns,
        ratio=ratio,
    )
    benchmark(fast)
    assert ratio >= 8


def rotating_loop(table, models: int, picked: int = 64):
    """acquire+release over `picked` models spread evenly across the table, named by strings
    equal to the table's keys but not the same objects (as names parsed from requests are)."""
    names = ["".join(["model-", str(m)]) for m in range(0, models, models // picked)][:picked]

    def run(acquire=table.acquire, release=table.release, names=names):
        for _ in range(LOOPS // len(names)):
            for name in names:
                release(acquire(name))

    return run


def test_acquire_cost_does_not_grow_with_the_table(benchmark):
    # The claim is "does not grow with the number of models or endpoints", not "fits in L1":
    # each loop touches the same number of models and only the table's size differs, 100x.
    # A cost linear in the table reads ~100 here. The measured 1.3-1.4 is what spreading the
    # same 64 models over 100x the memory costs (TLB and cache misses), which no table of that
    # size avoids; the earlier gate, one model and 1.2, failed on that noise 1 run in 4.
    small = rotating_loop(table_with(_fastpath, 100), 100)  # 400 endpoints
    large = rotating_loop(table_with(_fastpath, 10_000), 10_000)  # 40,000 endpoints
    large_ns, small_ns, ratio = paired(large, small, LOOPS)
    report(
        benchmark,
        "acquire+release ns/op by table size",
        endpoints_400=small_ns,
        endpoints_40000=large_ns,
        ratio=ratio,
    )
    benchmark(large)
    assert ratio <= 2.0


def test_acquire_release_stays_close_to_the_call_floor(benchmark, loop_counts):
    table = table_with(_fastpath, 1)
    # The table's own key object, so that the gate measures the table: a model name freshly
    # parsed from a request also costs the dict a string compare, measured and reported below
    # but not gated, since no table design avoids it.
    (model,) = (name for name in table.models())
    work = acquire_release_loop(table, model)
    fresh = acquire_release_loop(table, "".join(["model-", "0"]))

    def floor(noop=table.noop, model=model):
        # The same two calls with the same arguments, doing nothing: the cost of calling
        # into the extension from Python, which no implementation of the table can avoid.
        for _ in range(LOOPS):
            noop(noop(model))

    work_ns, floor_ns, ratio = paired(work, floor, LOOPS)
    fresh_ns, _, fresh_ratio = paired(fresh, floor, LOOPS, rounds=15)
    report(
        benchmark,
        "acquire+release vs the same calls doing nothing, ns",
        work=work_ns,
        floor=floor_ns,
        ratio=ratio,
        fresh_name=fresh_ns,
        fresh_name_ratio=fresh_ratio,
    )
    benchmark(work)
    within_floor("plain", ratio, loop_counts)


def test_keyed_acquire_stays_close_to_the_call_floor(benchmark, loop_counts):
    # Affinity: rendezvous hashing with bounded loads over the model's endpoints, against the
    # same calls with the same arguments doing nothing.
    table = table_with(_fastpath, 1)
    (model,) = (name for name in table.models())
    key = 0x6B43A9B5  # the router's keys are CRC-32s (router/path/affinity.py)

    def work(acquire=table.acquire, release=table.release, model=model, key=key):
        for _ in range(LOOPS):
            release(acquire(model, key))

    def floor(noop=table.noop, model=model, key=key):
        for _ in range(LOOPS):
            noop(noop(model, key))

    work_ns, floor_ns, ratio = paired(work, floor, LOOPS)
    report(
        benchmark,
        "keyed acquire+release vs the same calls doing nothing, ns",
        work=work_ns,
        floor=floor_ns,
        ratio=ratio,
    )
    benchmark(work)
    within_floor("keyed", ratio, loop_counts)


@pytest.mark.parametrize("endpoints", [4, 400, 4_000, 40_000])
def test_snapshot_holds_the_lock_only_for_the_copy(benchmark, endpoints):
    table = table_with(_fastpath, endpoints // 4)
    for m in range(0, endpoints // 4, 3):
        table.release(table.acquire(f"model-{m}"))
    held = []

    def snapshot():
        t0 = time.perf_counter_ns()
        table.snapshot()
        held.append((table.last_snapshot_lock_ns, time.perf_counter_ns() - t0))

    benchmark.pedantic(snapshot, rounds=20 if endpoints >= 40_000 else 100, iterations=1)
    lock_ns = min(h for h, _ in held)
    total_ns = min(t for _, t in held)
    report(
        benchmark,
        f"snapshot of {endpoints} endpoints us",
        lock_held=lock_ns / 1e3,
        whole=total_ns / 1e3,
        share=lock_ns / total_ns,
    )
    if endpoints >= 4_000:
        assert lock_ns / total_ns <= 0.1

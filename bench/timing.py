"""Interleaved best-of-N timing, so two things measured in one run share the machine's noise."""

import time


def per_op_ns(fn, ops_per_call: int, repeats: int = 7) -> float:
    """Best time per operation of `fn()` (which performs `ops_per_call` operations), in ns."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t0)
    return best / ops_per_call


def compare_ns(a, b, ops_per_call: int, rounds: int = 5) -> tuple[float, float]:
    """Best per-op times of `a` and `b`, measured alternately."""
    best_a = best_b = float("inf")
    for _ in range(rounds):
        best_a = min(best_a, per_op_ns(a, ops_per_call, repeats=3))
        best_b = min(best_b, per_op_ns(b, ops_per_call, repeats=3))
    return best_a, best_b

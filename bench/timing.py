"""Paired timing, so two things measured in one run share the machine's noise.

This machine's speed drifts by up to 2x over seconds (shared cores). Each round times `a` and
then `b` back to back, over a few milliseconds, on the thread's CPU time, and the ratio of that
pair is kept; the gate reads the median ratio over many rounds, which a slow second or two
cannot move.
"""

import statistics
import time


def time_ns(fn, ops_per_call: int) -> float:
    # CPU time of this thread: a round in which the scheduler ran another process is not
    # counted as slow.
    t0 = time.thread_time_ns()
    fn()
    return (time.thread_time_ns() - t0) / ops_per_call


def paired(a, b, ops_per_call: int, rounds: int = 101) -> tuple[float, float, float]:
    """(median ns/op of a, median ns/op of b, median of the per-round ratios a/b)."""
    a(), b()  # warm up
    times_a, times_b, ratios = [], [], []
    for _ in range(rounds):
        ta = time_ns(a, ops_per_call)
        tb = time_ns(b, ops_per_call)
        times_a.append(ta)
        times_b.append(tb)
        ratios.append(ta / tb)
    return statistics.median(times_a), statistics.median(times_b), statistics.median(ratios)

"""A cumulative histogram for Prometheus: bucket counts only grow, whatever is kept of the
values themselves."""

from __future__ import annotations

from bisect import bisect_left


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def copy(self) -> Histogram:
        copy = Histogram(self.buckets)
        copy.counts, copy.sum = list(self.counts), self.sum
        return copy

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str, help_text: str) -> list[str]:
        out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, count in zip((*self.buckets, "+Inf"), self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out.append(f"{name}_sum {self.sum}")
        out.append(f"{name}_count {running}")
        return out


# Demand to Ready for a swap: the victim's drain and stop plus the newcomer's engine start-up,
# seconds for a small engine to many minutes for a large model's weights.
SWAP_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800)

# Waking a sleeping engine: vLLM's level 1 in under a second to a few seconds, level 2 and
# large models longer; past a minute it is as slow as a cold start.
WAKE_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)

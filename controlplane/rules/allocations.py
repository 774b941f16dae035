"""GPU time charged to tenants over a window, kept so that asking costs the leader a read.

`allocate` (rules/cost.py) over 24 hours is 1,440 minutes of every model's split: done on
the event loop for every `/v1/usage` call, every scrape and every `gpuctl status --watch`
refresh, it held the leader 0.57 s at 50 tenants x 20 models. Here a closed minute is
allocated once and kept (its buckets no longer change: the meter and the ledger write only
the current minute); a window's sum is made in a worker thread, from a snapshot taken on the
loop, and an answer is reused for ANSWER_KEPT_S.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict

from controlplane.rules.cost import add_into, allocate_minute

ANSWER_KEPT_S = 5.0


class Allocations:
    def __init__(self) -> None:
        self.closed: dict[float, dict] = {}  # minute start -> its allocation
        self.bases: dict[str, str] = {}  # the adapters' bases the kept minutes were split by
        self.answers: dict[float, tuple[float, dict]] = {}  # since -> (when, answer)

    async def charged(self, meter, usage_minutes, bases: dict, since_s: float, now: float):
        """(tenant, model) -> [GPU-seconds, GiB-seconds asleep] over the last `since_s`."""
        kept = self.answers.get(since_s)
        if kept is not None and 0 <= now - kept[0] < ANSWER_KEPT_S and bases == self.bases:
            return kept[1]
        if bases != self.bases:
            self.closed, self.bases = {}, dict(bases)
        current = math.floor(now / 60.0) * 60.0
        # The snapshot, on the loop: closed minutes by reference (they no longer change), the
        # current one copied.
        tokens = {minute: bucket for minute, bucket in usage_minutes}
        window = [(m, b) for m, b in meter.minutes if m + 60.0 > now - since_s]
        fresh = [
            (m, {k: list(v) for k, v in b.items()}, _tokens(tokens.get(m, {})))
            for m, b in window
            if m >= current
        ]
        closed = [(m, b, tokens.get(m, {})) for m, b in window if m < current]
        answer = await asyncio.to_thread(self._sum, closed, fresh, dict(bases))
        for minute in [m for m in list(self.closed) if m < current - 24 * 3600.0]:
            del self.closed[minute]
        # Answers past their time go: a caller choosing a new `since` each time must not
        # grow the leader's memory.
        self.answers = {s: kept for s, kept in self.answers.items()
                        if 0 <= now - kept[0] < ANSWER_KEPT_S}  # fmt: skip
        self.answers[since_s] = (now, answer)
        return answer

    def _sum(self, closed: list, fresh: list, bases: dict) -> dict:
        total: dict = defaultdict(lambda: [0.0, 0.0])
        for minute, bucket, usage in closed:
            part = self.closed.get(minute)
            if part is None:
                part = self.closed[minute] = allocate_minute(bucket, _tokens(usage), bases)
            add_into(total, part)
        for _, bucket, served in fresh:
            add_into(total, allocate_minute(bucket, served, bases))
        return dict(total)


def _tokens(usage_bucket: dict) -> dict:
    """A ledger minute's {(tenant, model): prompt + completion tokens} (USAGE_FIELDS' 4th and
    5th)."""
    return {key: values[3] + values[4] for key, values in usage_bucket.items()}

"""What each model's replicas cost in GPU time, and who it is charged to.

Once a tick the leader meters the cards engines hold, in minute buckets per model:
- GPU-seconds: every card that holds an awake engine counts its seconds, split among the awake
  engines on it by the memory each takes (a card shared by two engines of 20 and 60 GB charges
  them a quarter and three quarters);
- GiB-seconds asleep: a sleeping engine's asleep memory on each of its cards.
The fleet's own GPU-seconds (the cards holding an awake engine, counted apart) are kept beside,
so that the split can be checked against them.

Charged per minute and model (`allocate`): to the tenants by the tokens (prompt and completion)
each had served of that model in that minute; a minute in which the model served no tokens is
idle, charged to its spec's `owner`, else to UNALLOCATED. A leader meters from its first tick:
the seconds of a failover (no leader ticking) are not metered.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque

import orjson

from controlplane.rules.sleep import awake_of, gpus_of, holds_card, is_sleeper

UNALLOCATED = "(unallocated)"
COST_ROW = "cost_minute/"  # the store's rows (records), one a minute
FLEET = ""  # the bucket's entry of the fleet's own GPU-seconds
MAX_GAP_S = 60.0  # a longer gap between ticks (a paused leader) is not charged
KEPT_S = 24 * 3600.0
MIB_PER_GIB = 1024.0


def card_seconds(replicas, specs: dict, nodes: dict, seconds: float) -> dict[str, list[float]]:
    """model -> [GPU-seconds, GiB-seconds asleep] over `seconds`, and FLEET -> [the cards
    holding an awake engine, in seconds, 0]."""
    awake_mib: dict = defaultdict(dict)  # card -> {replica id: (model, MiB)}
    charged: dict[str, list[float]] = {}
    for replica in replicas:
        spec = specs.get(replica.model)
        if spec is None:
            continue
        if holds_card(replica):
            for gpu in gpus_of(replica):
                awake_mib[gpu][replica.id] = (replica.model, awake_of(replica, nodes, gpu))
        elif is_sleeper(replica):
            gib = spec.asleep_mb() / MIB_PER_GIB * len(gpus_of(replica))
            charged.setdefault(replica.model, [0.0, 0.0])[1] += gib * seconds
    for engines in awake_mib.values():
        total = sum(mib for _, mib in engines.values())
        for model, mib in engines.values():
            charged.setdefault(model, [0.0, 0.0])[0] += seconds * mib / total
    charged[FLEET] = [seconds * len(awake_mib), 0.0]
    return charged


class GpuMeter:
    """The minute buckets: {model: [GPU-seconds, GiB-seconds asleep, owner]}."""

    def __init__(self) -> None:
        self.minutes: deque = deque()  # (minute start, {model: [gpu_s, gib_s, owner]})
        self.at: float | None = None  # the last tick metered
        self.dirty: set[float] = set()

    def measure(self, replicas, specs: dict, nodes: dict, now: float) -> None:
        at, self.at = self.at, now
        if at is None or not 0 < now - at <= MAX_GAP_S:
            return
        minute = math.floor(now / 60.0) * 60.0
        if not self.minutes or self.minutes[-1][0] != minute:
            self.minutes.append((minute, {}))
        bucket = self.minutes[-1][1]
        for model, (gpu_s, gib_s) in card_seconds(replicas, specs, nodes, now - at).items():
            spec = specs.get(model)
            entry = bucket.setdefault(model, [0.0, 0.0, spec.owner if spec else None])
            entry[0] += gpu_s
            entry[1] += gib_s
            if spec is not None:
                entry[2] = spec.owner
        self.dirty.add(minute)
        while self.minutes and self.minutes[0][0] < now - KEPT_S:
            self.dirty.add(self.minutes.popleft()[0])

    def fleet_gpu_seconds(self, since_s: float, now: float) -> float:
        return sum(
            bucket.get(FLEET, [0.0])[0]
            for minute, bucket in self.minutes
            if minute + 60.0 > now - since_s
        )

    def load(self, rows: dict[str, bytes]) -> None:
        minutes = [
            (float(key[len(COST_ROW) :]), orjson.loads(body))
            for key, body in rows.items()
            if key.startswith(COST_ROW)
        ]
        self.minutes = deque(sorted(minutes, key=lambda m: m[0]))

    def take_dirty_rows(self) -> dict[str, bytes | None]:
        rows: dict[str, bytes | None] = {}
        kept = {minute: bucket for minute, bucket in self.minutes if minute in self.dirty}
        for minute in self.dirty:
            bucket = kept.get(minute)
            rows[f"{COST_ROW}{int(minute)}"] = None if bucket is None else orjson.dumps(bucket)
        self.dirty.clear()
        return rows


def allocate(
    meter: GpuMeter, tokens: dict, since_s: float, now: float, bases: dict | None = None
) -> dict:
    """(tenant, model) -> [GPU-seconds, GiB-seconds asleep] over the last `since_s` seconds.
    `tokens`: minute start -> {(tenant, model): tokens served}. `bases`: adapter -> its base
    model: an adapter's tokens take their part of its base's GPU time (the engine that served
    them), charged under the adapter's name."""
    charged: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for minute, bucket in meter.minutes:
        if minute + 60.0 <= now - since_s:
            continue
        add_into(charged, allocate_minute(bucket, tokens.get(minute, {}), bases or {}))
    return dict(charged)


def allocate_minute(bucket: dict, served_tokens: dict, bases: dict) -> dict:
    """One minute's GPU time, (tenant, model) -> [GPU-seconds, GiB-seconds asleep]: each
    model's by the tokens each tenant had served of it (an adapter's of its base's), else to
    its owner or UNALLOCATED."""
    # engine's model -> (tenant, model asked for) -> tokens
    served: dict[str, dict[tuple[str, str], float]] = defaultdict(dict)
    for (tenant, model), n in served_tokens.items():
        if n > 0:
            served[bases.get(model, model)][(tenant, model)] = n
    charged: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for model, (gpu_s, gib_s, owner) in bucket.items():
        if model == FLEET:
            continue
        by_asker = served.get(model, {})
        whole = sum(by_asker.values())
        if not whole:
            by_asker, whole = {(owner or UNALLOCATED, model): 1.0}, 1.0
        for key, n in by_asker.items():
            into = charged[key]
            into[0] += gpu_s * n / whole
            into[1] += gib_s * n / whole
    return charged


def add_into(total: dict, part: dict) -> None:
    for key, (gpu_s, gib_s) in part.items():
        into = total[key]
        into[0] += gpu_s
        into[1] += gib_s


def tokens_by_minute(usage_minutes) -> dict:
    """The ledger's minute buckets as minute -> {(tenant, model): prompt + completion tokens}
    (USAGE_FIELDS: prompt_tokens and completion_tokens are the 4th and 5th)."""
    return {
        minute: {key: values[3] + values[4] for key, values in bucket.items()}
        for minute, bucket in usage_minutes
    }


def with_cost(rows: list[dict], charged: dict) -> list[dict]:
    """Usage rows with `gpu_seconds` and `asleep_gib_seconds`, and a row of no requests for
    each (tenant, model) charged without any (an owner's idle time, or UNALLOCATED)."""
    blank = {"requests": 0, "errors": 0, "rate_limited": 0, "prompt_tokens": 0,
             "completion_tokens": 0, "queue_wait_s": 0.0}  # fmt: skip
    by_key = {(row["tenant"], row["model"]): dict(row) for row in rows}
    for key in charged.keys() - by_key.keys():
        by_key[key] = {"tenant": key[0], "model": key[1], **blank}
    for key, row in by_key.items():
        gpu_s, gib_s = charged.get(key, (0.0, 0.0))
        row["gpu_seconds"] = round(gpu_s, 1)
        row["asleep_gib_seconds"] = round(gib_s, 1)
    return [by_key[key] for key in sorted(by_key)]

"""Rebalancing: a card whose awake models together run hot hands its quietest model to a
quieter card, one move at a time, without cutting a request.

Engines on one card share its compute, so two busy models on one card slow each other while
another card idles. Placement keeps them apart when it places (rules/placement.py), but rates
change after: a model placed quiet becomes popular beside another.

| a card and its awake models                                  | what happens                  |
|--------------------------------------------------------------|-------------------------------|
| one awake model, or their requests a second at or below a    | nothing                       |
| card's fair share of the fleet's (`placement.hot_rate`)      |                               |
| above it: its quietest model that is itself hot, Ready on    | it moves: a replica starts    |
| one card, resident MIN_RESIDENCY_S, not itself placed by a   | there; once that is Ready,    |
| move since it last woke, where the placer would put another  | this one takes the safe stop  |
| replica of it a card that holds no sleeper and whose load    | (its requests finish there)   |
| with it stays at or below what this card keeps without it    |                               |
| a move already under way anywhere, or a model waiting for    | nothing this tick             |
| room or to wake                                              |                               |

Only hot models are parted: a quiet neighbour slows a hot model little, and its move costs a
cold start. And only while memory is not wanted: measured on bench.multiplex, moves onto cards
where sleepers wake, or while models wait, spread the awake memory over the cards so that no
card keeps room for a wake, and cost more than the sharing they end (0.99 -> 0.93-0.97 of
dedicated on the Aegaeon-shaped trace).

"At or below what this card keeps without it" (load(B) + r <= load(A) - r) is what keeps two
cards from trading a model back and forth: each move narrows the gap between the busiest
card and the one it gives to. A replica a move placed is not moved again in its residency
(until it has slept and woken), so a model moves at most once a residency whatever the
rates do.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.rules.held import holds_awake, holds_reserve
from controlplane.rules.placement import Placer
from controlplane.vocabulary.model import Replica, ReplicaState, Slice

Gpu = tuple[str, int]

# A rate is read over a window (vocabulary/rates.py); a replica younger than this has not
# been there long enough for its card's rate to say anything about it.
MIN_RESIDENCY_S = 60.0


@dataclass(frozen=True)
class Rebalance:
    replica: Replica  # the one that moves
    card: Gpu  # the hot card it leaves
    to: list[Slice]  # where its replacement would start
    why: str


def movable(replica: Replica, now: float) -> bool:
    return (
        replica.state == ReplicaState.READY
        and replica.gpu_count == 1
        and not replica.moving
        and not replica.moved_in
        and now - replica.ready_at >= MIN_RESIDENCY_S
    )


def plan_rebalance(
    replicas: list[Replica],
    rates: dict[str, float],
    load: dict[Gpu, float],
    hot: float,
    placer_for,
    specs: dict,
    now: float,
) -> Rebalance | None:
    """The one move this tick, if a card runs hot (see the table). `rates`: replica ->
    requests a second; `load`: card -> its awake replicas' rates summed; `hot`: a card's fair
    share; `placer_for()`: a fresh Placer over the fleet as it stands; `now`: wall clock."""
    if any(r.moving for r in replicas):
        return None
    awake_on: dict[Gpu, list[Replica]] = {}
    asleep_on: set[Gpu] = set()
    for replica in replicas:
        for piece in replica.placement:
            for index in piece.gpus:
                if holds_awake(replica):
                    awake_on.setdefault((piece.node, index), []).append(replica)
                elif holds_reserve(replica):
                    asleep_on.add((piece.node, index))
    hot_cards = sorted(
        (gpu for gpu, here in awake_on.items() if len({r.model for r in here}) > 1
         and load.get(gpu, 0.0) > hot),
        key=lambda gpu: (-load.get(gpu, 0.0), gpu),
    )  # fmt: skip
    for gpu in hot_cards:
        candidates = [
            r for r in awake_on[gpu]
            if movable(r, now) and rates.get(r.id, 0.0) > hot and r.model in specs
        ]  # fmt: skip
        if not candidates:
            continue
        quietest = min(candidates, key=lambda r: (rates.get(r.id, 0.0), r.id))
        rate = rates[quietest.id]
        placer: Placer = placer_for()
        outcome = placer.place(specs[quietest.model], 1)
        if not outcome.placements:
            continue
        to = outcome.placements[0]
        target = (to[0].node, to[0].gpus[0])
        if target in asleep_on:
            continue  # its sleepers wake into that memory: a swap would cost more than sharing
        after = load.get(target, 0.0) + rate
        left = load.get(gpu, 0.0) - rate
        if after > left:
            continue
        why = (
            f"moved off {gpu[0]}/{gpu[1]}: its awake models ran {load[gpu]:.2f} requests/s, "
            f"above a card's share ({hot:.2f}); {target[0]}/{target[1]} takes its "
            f"{rate:.2f} at {after:.2f}"
        )
        return Rebalance(quietest, gpu, to, why)
    return None

"""Memory held is what the card holds: the one rule every count of a card's memory reads
(placement, making room, waking, the summary, GPU-seconds).

A replica holds, on each of its cards:

| the replica                                                | what it holds on each card       |
|------------------------------------------------------------|----------------------------------|
| ordered to start (Pending), until its agent reports it     | awake: the larger of what it was |
| gone (Starting, Ready, Unhealthy, Retiring, Stopping,      | started with and NVML's last     |
| Failed, its model deleted or not)                          | reading                          |
| told to sleep, its agent not yet saying Asleep (Sleeping)  | awake: its engine holds it all   |
| its agent said Asleep                                      | its asleep reserve (or more, as  |
|                                                            | NVML read since)                 |
| told to wake (Waking), and from then on                    | awake again                      |
| Stopping or Failed from asleep                             | its asleep reserve, until gone   |
| its agent says its process is gone on that node (a Failed  | nothing there                    |
| report, or no report of it at all)                         |                                  |

"What it was started with" is the memory share in the engine's command (vLLM's
`--gpu-memory-utilization`), fixed when the replica is placed and kept on the replica: a
re-applied spec changes what new engines get, never what running ones hold. The share is
rounded down, so an engine never takes more than its spec says. A replica from an older store,
placed before the share was kept, is given its spec's share plus a hundredth on load (what an
older version handed out, rounded to the nearest); one whose spec went too holds its whole
card until it is gone. Per card, controlplane/rules/sleep.py (`awake_of`, `reserve_of`) reads
these.
"""

from __future__ import annotations

import math

from controlplane.vocabulary.model import ModelSpec, Replica, ReplicaState

DEFAULT_SHARE = 0.9  # vLLM's --gpu-memory-utilization when the fleet cannot say


def memory_share(spec: ModelSpec, cards_mb: list[int]) -> float:
    """The share of each card an engine of `spec` is started with on cards of `cards_mb`:
    what its spec asks for of the smallest, rounded down to hundredths (never more)."""
    smallest = min((mb for mb in cards_mb if mb > 0), default=0)
    if not smallest:
        return DEFAULT_SHARE
    share = min(spec.awake_mb(smallest) / smallest, 1.0)
    return max(0.01, math.floor(share * 100 + 1e-9) / 100)


def fix_started(replica: Replica, spec: ModelSpec, cards_mb: list[int]) -> Replica:
    """Keep on `replica` what its engine is started with on cards of `cards_mb`: its share,
    and its asleep reserve. Returns it."""
    replica.memory_share = memory_share(spec, cards_mb)
    replica.reserve_mb = spec.asleep_mb()
    return replica


def holds_memory(replica: Replica, node: str) -> bool:
    """Whether `replica`'s process may hold memory on `node`'s cards: from the order that
    starts it until its agent there reports it gone."""
    return node not in replica.gone_from


def holds_awake(replica: Replica) -> bool:
    """Whether `replica` holds its awake memory somewhere: its process may run and its agent
    has not said it sleeps."""
    if replica.asleep_held:
        return False
    return any(holds_memory(replica, piece.node) for piece in replica.placement)


def holds_reserve(replica: Replica) -> bool:
    """Whether `replica` holds only its asleep reserve, its process still there."""
    return replica.asleep_held and any(holds_memory(replica, p.node) for p in replica.placement)


def awake_held_mb(replica: Replica, card_mb: int) -> int:
    """MiB an awake `replica` holds on a card of `card_mb`: the larger of its started share
    and what NVML last read; at least 1, so that a card of unknown size counts as used."""
    started = math.ceil(replica.memory_share * card_mb) if replica.memory_share else card_mb
    return max(1, started, replica.gpu_memory_used_mb)


def asleep_held_mb(replica: Replica) -> int:
    """MiB a sleeping `replica` holds on each card: its reserve, or what NVML read since it
    fell asleep when that is more."""
    return max(1, replica.reserve_mb, replica.gpu_memory_used_mb)


def allowed_mb(replica: Replica, card_mb: int, spec: ModelSpec | None = None) -> int:
    """What `replica`'s engine may hold of a card of `card_mb` now: its reserve asleep;
    awake, its spec's `gpu_memory` or the share it was started with, whichever is more."""
    if replica.asleep_held:
        return replica.reserve_mb
    started = math.ceil(replica.memory_share * card_mb) if replica.memory_share else 0
    return max(started, spec.awake_mb(card_mb) if spec is not None else 0)


def engine_gone(replica: Replica, node: str, report: dict | None) -> bool:
    """Whether `node`'s report of `replica` (None: it did not report it) says its process is
    gone there. Only an agent that no longer runs an engine stops reporting it; a Stopping
    engine is still reported until it has exited."""
    if report is None:
        return True
    return report.get("state") in ("Failed", "Stopped") and replica.state in (
        ReplicaState.FAILED,
        ReplicaState.STOPPING,
    )

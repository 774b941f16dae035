"""The safe stop's second half: what was withdrawn (a route, a route on the way to sleep, an
adapter's route on one replica) goes once no router holds it.

| withdrawn, and                                          | what happens                  |
|---------------------------------------------------------|-------------------------------|
| every live router acked a table without it, nothing in  | Retiring: Drained (it stops); |
| flight on any router, no silent router had it           | on its way to sleep: its      |
|                                                         | engine told to sleep; an      |
|                                                         | adapter: unloaded             |
| some router still holds it                              | it waits; its reason names    |
|                                                         | the router                    |
"""

from __future__ import annotations

from controlplane.rules.adapters import slot_id
from controlplane.rules.view import FleetView
from controlplane.vocabulary.actions import Drained, Hold, SleepEngine, Unloaded
from controlplane.vocabulary.model import ReplicaState

WAITING = "; waiting: "
WITHDRAWN = "; route withdrawn"


def _hold(replica, held: str) -> list:
    if replica.reason.endswith(held):
        return []
    return [Hold(replica.id, f"{replica.reason.split(WAITING)[0]}{WAITING}{held}")]


def drained(view: FleetView) -> list:
    actions: list = []
    for replica in view.replicas.values():
        if replica.state != ReplicaState.RETIRING:
            continue
        held = view.still_held(replica.id, replica.withdrawn_version)
        if held:
            actions += _hold(replica, held)
            continue
        reason = replica.reason.split(WAITING)[0].removesuffix(WITHDRAWN)
        actions.append(Drained(replica.id, f"{reason}: no router holds it"))
    return actions


def fall_asleep(view: FleetView) -> list:
    actions: list = []
    for replica in view.replicas.values():
        if replica.state != ReplicaState.SLEEPING or replica.sleep:
            continue
        held = view.still_held(replica.id, replica.withdrawn_version)
        if held:
            actions += _hold(replica, held)
            continue
        spec = view.specs.get(replica.model)
        level = spec.sleep_level if spec and spec.sleep_level else 1
        reason = replica.reason.split(WAITING)[0].removesuffix(WITHDRAWN)
        why = f"{reason}: engine told to sleep (level {level})"
        actions.append(SleepEngine(replica.id, level, why))
    return actions


def unloaded(view: FleetView) -> list:
    actions: list = []
    for replica in view.replicas.values():
        done = tuple(
            a
            for a, version in replica.unloading.items()
            if not view.still_held(slot_id(replica.id, a), version)
        )
        if done:
            actions.append(Unloaded(replica.id, done))
    return actions

"""Sleeping engines (controlplane/rules/sleep.py plans the moves): wakes for models asked for, sleep
for idle replicas, and engines that miss their wake timeout.

| a model asked for, fewer engines awake than it keeps | what happens                        |
|-------------------------------------------------------|-------------------------------------|
| GPUs are kept for it already                          | nothing: the room step goes on      |
| a replica of it on its way to sleep, engine awake     | it serves again                     |
| a sleeper whose cards are free                        | woken now                           |
| a sleeper whose cards' occupants may make way         | they sleep or go; its cards kept;   |
|                                                       | woken once they have                |
| every sleeper blocked for good, free cards elsewhere  | the sleeper stops; a cold start     |
|                                                       | goes there                          |
| every sleeper blocked for a while (occupants in use,  | a cold start there at once; the     |
| young), memory free elsewhere fits it                 | sleeper stays until the rules stop it |
| every sleeper blocked for a while                     | it waits; its reason says for what  |

| a replica                                          | what happens                         |
|----------------------------------------------------|--------------------------------------|
| Ready, idle past `sleep.after`, above the floor    | put to sleep (the safe stop, then sleep) |
| asleep, idle past `scale_to_zero_after`            | stopped at once (nothing routes to it) |
| waking past its `wake_timeout`                     | failed: its model starts another cold |
| told to sleep, not asleep within `wake_timeout`    | stopped, one fewer kept              |
"""

from __future__ import annotations

from controlplane.rules.sleep import plan_idle, plan_wake
from controlplane.rules.view import LIVE, FleetView
from controlplane.state.records import Reservation
from controlplane.tick.steps.moves import carry_out
from controlplane.tick.steps.scaling import asking
from controlplane.vocabulary.actions import (
    Counted,
    Fail,
    Place,
    Reserve,
    Revive,
    SetDemandSince,
    SetReason,
    SetRoom,
    SetScaled,
    SetWoken,
    Stop,
    Wake,
)
from controlplane.vocabulary.model import ReplicaState, Slice
from controlplane.vocabulary.specs import format_duration as duration


def sleep_timeouts(view: FleetView) -> list:
    actions: list = []
    kept: dict[str, int] = {}
    for replica in view.replicas.values():
        spec = view.specs.get(replica.model)
        if spec is None:
            continue
        limit = spec.wake_timeout_s
        if replica.state == ReplicaState.WAKING and view.now - replica.woken_at > limit:
            why = f"did not wake within {duration(limit)}: restarted cold"
            actions.append(Fail(replica.id, why))
        elif (
            replica.state == ReplicaState.SLEEPING
            and replica.sleep
            and view.now - replica.slept_at > limit
        ):
            kept[spec.name] = kept.get(spec.name, view.desired(spec)) - 1
            actions += [
                SetScaled(spec.name, kept[spec.name]),
                Stop(replica.id, f"did not fall asleep within {duration(limit)}"),
            ]
    return actions


def sleep_idle(view: FleetView) -> list:
    if not any(s.sleep_level is not None for s in view.specs.values()):
        return []
    plan = plan_idle(view.room_inputs(), view.woken_at)
    stops = [Counted("idle") for move in plan.moves if move.action == "stop"]
    return carry_out(view, plan.moves) + stops


def asked_models(view: FleetView) -> list[str]:
    """Models asked for, in the order they wake: higher priority first."""
    return sorted(asking(view), key=lambda m: (-view.specs[m].priority, m))


def wake_asked(view: FleetView, model: str) -> list:
    spec = view.specs[model]
    if model in view.reservations:
        return []
    mine = view.replicas_of(model)
    awake = sum(1 for r in mine if r.state in LIVE or r.state == ReplicaState.WAKING)
    if awake >= view.desired(spec):
        return []
    kept_for_others = view.kept_for_others()
    dozing = [
        r
        for r in mine
        if r.state == ReplicaState.SLEEPING and not r.sleep and r.id not in kept_for_others
    ]
    if dozing:
        # Its engine is still awake, only its routes are going: it serves again.
        return [Revive(dozing[0].id, "wanted again before it slept")]
    asleep = [r for r in mine if r.state == ReplicaState.ASLEEP and r.sleep]
    if not asleep:
        return []
    actions: list = []
    if model not in view.demand_since:
        actions.append(SetDemandSince(model, view.now))
    since = view.demand_since.get(model, view.now)
    plan = plan_wake(spec, view.room_inputs(), view.card_load())
    if plan.replica is None:
        elsewhere = view.placer().place(spec, 1).placements
        if plan.final and elsewhere:
            # No sleeper can ever wake where it is (what holds its cards is there for good),
            # free cards wait elsewhere: a cold start there; the sleeper goes.
            return actions + [Stop(asleep[0].id, f"replaced by a cold start: {plan.reason}")]
        if elsewhere:
            # What holds its cards may pass, but not now: free memory elsewhere fits it, so a
            # cold start goes there at once rather than waiting; the sleeper stays where it is
            # until the usual rules stop it.
            where = ", ".join(piece.node for piece in elsewhere[0])
            return actions + [
                Place(model, elsewhere[0], swap_since=since,
                      why=f"started cold on {where}: {plan.reason}"),  # fmt: skip
                SetWoken(model),
                SetRoom(model, None),
                SetReason(model, ""),
            ]
        reason = f"waiting to wake: {plan.reason}"
        room = {"reason": reason, "victims": [], "final": False, "wake": True}
        return actions + [SetRoom(model, room), SetReason(model, reason, quiet=True)]
    if plan.now:
        return actions + [
            SetWoken(model),
            Wake(plan.replica.id, f"woken: {asking(view)[model]}"),
            SetRoom(model, None),
            SetReason(model, ""),
        ]
    actions += carry_out(view, plan.moves)
    placement = [Slice(p.node, list(p.gpus)) for p in plan.replica.placement]
    victims = [m.replica.id for m in plan.moves]
    reservation = Reservation(model, placement, victims, since, view.now, wake=plan.replica.id)
    reason = f"waiting for room: {', '.join(victims)} making way to wake {plan.replica.id}"
    room = {"reason": reason, "victims": victims, "final": False, "wake": True}
    return actions + [Reserve(reservation, room), SetReason(model, reason)]

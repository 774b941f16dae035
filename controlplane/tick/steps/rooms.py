"""Making room (controlplane/rules/room.py picks the victims): the demand it is made for, the GPUs
kept while victims go, and placing on them once they are free.

| a model asking for replicas (steps/scaling.py `asking`) | what happens                     |
|----------------------------------------------------------|----------------------------------|
| nobody asks any more                                     | its demand and room records go   |
| short of replicas, not yet waiting                       | it waits from now                |
| short, fits as the fleet stands                          | nothing: placement places it     |
| short, victims found                                     | victims sleep or go (safe stop); |
|                                                          | their GPUs kept for it           |
| short, none found                                        | waits (or is told it never gets  |
|                                                          | room: `final`); its reason names |
|                                                          | the blockers                     |

| GPUs kept for a model                                    | what happens                     |
|----------------------------------------------------------|----------------------------------|
| its model or one of the nodes went                        | kept no longer: plan again      |
| a victim still holds them, nobody asks any more           | kept no longer (said)           |
| a victim still holds them past `room_timeout_s`           | kept no longer (said)           |
| a victim still holds them, room came free elsewhere first | kept no longer (said)           |
| free, but sleepers beside them keep too much memory       | the sleepers stop               |
| free                                                      | placed there (or its sleeper    |
|                                                           | woken there)                    |

Models are taken higher priority first, then the one waiting longest; each sees the GPUs
kept for the ones before it.
"""

from __future__ import annotations

from collections import Counter

from controlplane.rules.placement import eligible
from controlplane.rules.room import plan_room
from controlplane.rules.sleep import fits_awake, fits_woken, memory_stops, settled, victim_moves
from controlplane.rules.view import PRESENT, FleetView
from controlplane.state.records import Reservation
from controlplane.tick.steps.moves import carry_out
from controlplane.tick.steps.scaling import asking
from controlplane.vocabulary.actions import (
    Place,
    Release,
    Reserve,
    SetDemandSince,
    SetReason,
    SetRoom,
    SetWoken,
    Wake,
)
from controlplane.vocabulary.model import ReplicaState
from controlplane.vocabulary.specs import format_duration as duration


def reserved_models(view: FleetView) -> list[str]:
    return list(view.reservations)


def place_on_reserved(view: FleetView, model: str) -> list:
    kept = view.reservations.get(model)
    if kept is None:
        return []
    spec = view.specs.get(model)
    usable = spec is not None and all(
        (node := view.nodes.get(piece.node)) is not None and eligible(node)
        for piece in kept.placement
    )
    if not usable:
        return [Release(model)]  # its model went, or a node: plan again
    memory = view.sleepers()
    woken = view.replicas.get(kept.wake) if kept.wake else None
    if woken is not None:
        memory.remove(woken, spec, view.nodes)  # its own reserve becomes its awake memory

    def fits(gpu) -> bool:
        if woken is not None:
            return fits_woken(woken, gpu, view.nodes, memory.awake[gpu])
        return fits_awake(spec, gpu, view.nodes, memory.awake[gpu])

    crowded = [gpu for gpu in kept.gpus() if not fits(gpu)]
    if crowded:
        given_up = give_up_room(view, spec, kept)
        return [Release(model, given_up)] if given_up else []  # else a victim still goes
    gpus = sorted(kept.gpus())
    stops = memory_stops(spec, gpus, view.room_inputs(), memory, {kept.wake}, woken=woken)
    if stops:
        # Sleepers beside the freed cards leave too little memory for it awake.
        actions = carry_out(view, stops)
        if any(m.action == "blocked" for m in stops):
            actions.append(Release(model))  # plan again, elsewhere
        return actions
    actions: list = [Release(model)]
    victims = ", ".join(kept.victims)
    if kept.wake:
        sleeper = view.replicas.get(kept.wake)
        if sleeper is None or sleeper.state != ReplicaState.ASLEEP:
            return actions  # it went meanwhile: the next tick plans again
        return actions + [
            SetWoken(model),
            Wake(sleeper.id, f"woken after {victims} made way", swap_since=kept.since),
            SetRoom(model, None),
            SetReason(model, ""),
        ]
    placed = sum(1 for r in view.replicas_of(model) if r.state in PRESENT)
    if placed >= view.desired(spec):
        return actions  # it found room elsewhere meanwhile
    nodes = ", ".join(piece.node for piece in kept.placement)
    return actions + [
        Place(
            model,
            kept.placement,
            swap_since=kept.since,
            why=f"placed on {nodes} after {victims} made way",
        ),  # fmt: skip
        SetWoken(model),  # not stopped for idleness before its time
        SetRoom(model, None),
        SetReason(model, ""),
    ]


def give_up_room(view: FleetView, spec, kept) -> str:
    """Why GPUs kept for `spec` while its victims stop should be kept no longer ("" to keep
    them)."""
    if spec.name not in asking(view):
        return "no request waits for it any more"
    timeout = view.settings.room_timeout_s
    if view.now - kept.made_at > timeout:
        return f"its victims did not stop within {duration(timeout)}"
    if kept.wake:
        return ""  # a wake is the cheapest move there is
    if view.placer(but_for=spec.name).place(spec, 1).placements:
        return "room came free elsewhere first"
    return ""


def demand(view: FleetView) -> list:
    """Since when each model short of replicas has been asked for; what nobody asks for any
    more is forgotten."""
    wanted = asking(view)
    actions: list = [SetDemandSince(m, None) for m in view.demand_since if m not in wanted]
    actions += [SetRoom(m, None) for m in view.room if m not in wanted]
    for model in short(view, wanted):
        if model not in view.demand_since:
            actions.append(SetDemandSince(model, view.now))
    return actions


def short(view: FleetView, wanted: dict[str, str]) -> list[str]:
    out = []
    for model in wanted:
        placed = sum(1 for r in view.replicas_of(model) if r.state in PRESENT)
        if placed < view.desired(view.specs[model]) and model not in view.reservations:
            out.append(model)
    return out


def waiting_models(view: FleetView) -> list[str]:
    """The models that make room, in turn: higher priority first, then the longest waiting."""
    models = short(view, asking(view))
    return sorted(
        models,
        key=lambda m: (-view.specs[m].priority, view.demand_since.get(m, view.now), m),
    )


def make_room(view: FleetView, model: str) -> list:
    spec = view.specs[model]
    outcome = view.placer().place(spec, 1)
    if outcome.placements:
        return []  # it fits now: the next tick places it
    return take_room(view, spec, asking(view).get(model, ""), outcome.reason)


def take_room(view: FleetView, spec, why: str, placement_reason: str) -> list:
    name = spec.name
    inputs = view.room_inputs()
    plan = plan_room(spec, inputs)
    if plan.placement is None:
        if plan.final:
            # Only what blocks it for good: the rest would pass and still leave no room.
            for_good = [str(b) for b in plan.blockers if b.permanent]
            cannot = f"no room can be made: {'; '.join(for_good)}" if for_good else ""
            reason = "; ".join(x for x in (placement_reason, cannot) if x)
        else:
            reason = f"waiting for room: {plan.reason}"
        blocking = [b.replica for b in plan.blockers]
        before = view.room.get(name)
        room = {"reason": reason, "victims": [], "blocking": blocking, "final": plan.final}
        same = before is not None and before.get("blocking") == blocking
        return [SetRoom(name, room), SetReason(name, reason, quiet=same)]
    gpus = sorted((p.node, i) for p in plan.placement for i in p.gpus)
    if not plan.victims:
        # Free cards, but sleepers on them keep too much memory: they go (a plan whose
        # sleepers may not go leaves the model waiting, and says why).
        stops = memory_stops(spec, gpus, inputs, view.sleepers())
        blocked = [m.why for m in stops if m.action == "blocked"]
        if blocked:
            return [SetReason(name, "waiting for room: " + "; ".join(blocked))]
        return carry_out(view, stops)
    memory, planned = view.sleepers(), Counter()
    moves = victim_moves(plan.victims, f"to make room for {name}: {why}", inputs, memory, planned)
    moves = settled(moves + memory_stops(spec, gpus, inputs, memory, planned=planned))
    blocked = [m.why for m in moves if m.action == "blocked"]
    if blocked:
        # A room that cannot be made takes nothing: no victim goes for a model that still
        # would not fit.
        return [SetReason(name, "waiting for room: " + "; ".join(blocked))]
    actions = carry_out(view, moves)
    victims = [v.id for v in plan.victims]
    since = view.demand_since.get(name, view.now)
    nodes = ", ".join(piece.node for piece in plan.placement)
    sleeping = [m.replica.id for m in moves if m.action == "sleep"]
    stopping = [v for v in victims if v not in sleeping]
    how = "; ".join(
        f"{verb} {', '.join(ids)}"
        for verb, ids in (("stopping", stopping), ("putting to sleep", sleeping))
        if ids
    )
    reason = f"waiting for room: {how} on {nodes}"
    room = {"reason": reason, "victims": victims, "final": False}
    reservation = Reservation(name, plan.placement, victims, since, view.now)
    return actions + [Reserve(reservation, room), SetReason(name, reason)]

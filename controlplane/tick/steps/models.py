"""Each model towards the replicas it keeps: placed, revived, scaled down, replaced, drained;
woken from zero by demand; scaled to zero by idleness.

| a model's replicas (present: awake or asleep)    | what happens                                |
|--------------------------------------------------|---------------------------------------------|
| at zero, requests wait (not zero by the operator) | kept: max(min_replicas, 1); retiring |
|                                                  | ones serve again first                 |
| fewer than it keeps, one retiring (engine awake) | it serves again: no cold start              |
| fewer, GPUs kept for it (room being made)        | nothing: it goes where its GPUs are kept    |
| fewer, it fits                                   | placed (best fit)                           |
| fewer, it does not fit, min_replicas 0, nobody   | at zero until a request comes, not an error |
| waits, the fleet's cards could hold it           |                                             |
| fewer, it does not fit                           | its reason says why                         |
| more than it keeps                               | the least useful stop (not Ready, then one  |
|                                                  | back with its node, then none in flight,    |
|                                                  | then the longest idle, then the newest):    |
|                                                  | the safe stop                               |
| on a draining node                               | stopped once its replacements are Ready (or |
|                                                  | at once when none fits)                      |
| on a failed GPU                                  | stopped once its replacement is Ready       |
| scale_to_zero_after, idle that long, above the   | withdrawn (safe stop), one fewer kept       |
| floor, not woken more recently than that         |                                             |

Every stop here is a Stop or a Withdraw: the executor sends any replica that had a route
through the safe stop, whatever its state (an Unhealthy one may still carry streams).
"""

from __future__ import annotations

from controlplane.rules.placement import Placer
from controlplane.rules.scaling import plan_idle_stops
from controlplane.rules.view import PRESENT, FleetView
from controlplane.vocabulary.actions import (
    Counted,
    Event,
    Place,
    Revive,
    SetMoving,
    SetReason,
    SetRoom,
    SetScaled,
    SetWoken,
    Stop,
    Withdraw,
)
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import ReplicaState, Schedulable, gpu_faults


def at_zero(view: FleetView) -> list:
    """Requests wait for a model at zero: it keeps max(min_replicas, 1) again, replicas still
    retiring serving first."""
    actions: list = []
    kept_for_others = view.kept_for_others()
    for model, waiting in sorted(view.wanted().items()):
        spec = view.specs[model]
        if spec.ceiling == 0 or view.desired(spec) > 0:
            continue  # at zero by the operator's word, or already on its way
        target = max(spec.floor, 1)
        retiring = [
            r
            for r in view.replicas_of(model)
            if r.state == ReplicaState.RETIRING and r.id not in kept_for_others
        ]
        actions.append(SetWoken(model))
        actions += [Revive(r.id, "woken before it stopped") for r in retiring[:target]]
        actions += [
            SetScaled(model, target),
            Event(model, f"woken by {waiting} waiting request(s): {target} replica(s)"),
        ]
    return actions


def idle_stops(view: FleetView) -> list:
    """Models with `scale_to_zero_after`: replicas idle that long go, down to min_replicas."""
    actions: list = []
    in_flight = None
    for spec in view.specs.values():
        after = spec.scale_to_zero_after_s
        if after is None:
            continue
        desired = view.desired(spec)
        woke = view.woken_at.get(spec.name)
        if desired - spec.floor <= 0 or (woke and view.now - woke < after):
            continue
        ready = [r for r in view.replicas_of(spec.name) if r.state == ReplicaState.READY]
        idle = view.idle.idle_map([r.id for r in ready], view.now)
        if in_flight is None:
            in_flight = view.idle.in_flight(view.now)
        plan = plan_idle_stops(ready, idle, after, desired - spec.floor, {}, in_flight)
        for replica in plan.stop:
            seconds, state = idle[replica.id]
            bound = "≥" if state == IdleState.AT_LEAST else ""
            desired -= 1
            actions += [
                SetScaled(spec.name, desired),
                Withdraw(replica.id, f"idle {bound}{round(seconds)}s"),
                Counted("idle"),
            ]
    return actions


def models(view: FleetView) -> list:
    placer = view.placer()
    wanted = view.wanted()
    draining = {n.name for n in view.nodes.values() if n.schedulable == Schedulable.DRAINING}
    actions: list = []
    for spec in list(view.specs.values()):
        actions += _model(view, spec, placer, wanted, draining)
    return actions


def revivable(view: FleetView, model: str, draining: set[str]) -> list:
    """Replicas of `model` on their way out whose engines are awake and may serve again: none
    that a reservation counts on to free its GPUs, none on a draining node or a failed GPU."""
    kept_for_others = view.kept_for_others()
    return [
        r
        for r in view.replicas_of(model)
        if (
            r.state == ReplicaState.RETIRING
            or (r.state == ReplicaState.SLEEPING and not r.sleep)  # its engine still awake
        )
        and r.url
        and not r.moving
        and r.id not in kept_for_others
        and not draining.intersection(r.nodes)
        and not gpu_faults(r, view.nodes)
    ]


def _model(view: FleetView, spec, placer: Placer, wanted: dict, draining: set[str]) -> list:
    name = spec.name
    mine = [r for r in view.replicas_of(name) if r.state in PRESENT]
    # A replica on a failed GPU (Degraded) is replaced like one on a draining node, but is
    # stopped only once its replacement is Ready: it may still be serving meanwhile.
    degraded = {r.id for r in mine if gpu_faults(r, view.nodes)}
    # One moving off a hot card (tick/steps/rebalance.py) goes the same way, once its
    # replacement, started where the placer puts it, is Ready.
    moving = {r.id for r in mine if r.moving and r.id not in degraded}
    staying = [r for r in mine if not draining.intersection(r.nodes)
               and r.id not in degraded and r.id not in moving]  # fmt: skip
    leaving = [r for r in mine if draining.intersection(r.nodes)]
    replaced = [r for r in mine if r.id in degraded and not draining.intersection(r.nodes)]
    moved = [r for r in mine if r.id in moving and not draining.intersection(r.nodes)]
    desired = view.desired(spec)
    missing = desired - len(staying)
    actions: list = []
    ready = {r.id for r in staying if r.state == ReplicaState.READY}
    reason = view.reasons.get(name, "")
    if missing > 0:
        # Wanted again before it stopped: a retiring replica serves at once, no cold start.
        for replica in revivable(view, name, draining)[:missing]:
            actions.append(Revive(replica.id, "wanted again before it stopped"))
            staying.append(replica)
            ready.add(replica.id)
            missing -= 1
    if missing > 0 and name in view.reservations:
        pass  # room is being made for it: it goes where its GPUs are kept
    elif missing > 0:
        outcome = placer.place(spec, missing)
        # The last ones placed stand for the moving replicas: a move places no more than that.
        first_moved = len(outcome.placements) - len(moved)
        actions += [
            Place(name, placement, moved=i >= first_moved)
            for i, placement in enumerate(outcome.placements)
        ]
        short = outcome.reason
        if short and moved:
            # Its replacement no longer fits anywhere: the move is off, the replica stays.
            actions += [SetMoving(r.id, "") for r in moved]
            if missing - len(moved) <= len(outcome.placements):
                short = ""
            moved = []
        if (
            short
            and spec.floor == 0
            and not wanted.get(name)
            and Placer(list(view.nodes.values()), set()).place(spec, 1).placements
        ):
            # It would fit on the fleet's cards, others hold them, and nobody waits for it:
            # at zero until a request comes (and makes room), not an error.
            actions += [
                SetScaled(name, len(staying) + len(outcome.placements)),
                Event(name, f"at zero until a request comes: {outcome.reason}"),
                SetReason(name, ""),
            ]
            reason = ""
        elif name not in view.room:
            actions.append(SetReason(name, short))
            reason = short
    elif not view.room.get(name, {}).get("wake"):
        actions += [SetReason(name, ""), SetRoom(name, None)]
        reason = ""
    extra = len(staying) - desired
    if extra > 0:
        idle = view.idle.idle_map([r.id for r in staying], view.now)
        in_flight = view.idle.in_flight(view.now)

        def usefulness(replica):
            # One back with its node was replaced meanwhile: it makes way for its replacement.
            # One carrying requests is drained last: one without any goes at once.
            busy = in_flight.get(replica.id, 0) > 0
            return (
                replica.id in ready,
                not replica.lost,
                busy,
                -idle[replica.id][0],
                -replica.created_at,
            )

        for replica in sorted(staying, key=usefulness)[:extra]:
            actions.append(Stop(replica.id, f"scaled down to {desired}"))
            ready.discard(replica.id)
    # Replicas on draining nodes go once their replacements are ready, or at once when no
    # replacement fits (the drain goes on; the model's reason tells the operator why).
    if leaving and (len(ready) >= desired or reason):
        actions += [Stop(r.id, "node draining") for r in leaving]
    if replaced and len(ready) >= desired:
        for replica in replaced:
            faults = "; ".join(gpu_faults(replica, view.nodes))
            actions.append(Stop(replica.id, f"replaced: {faults}"))
    if moved and len(ready) >= desired:
        actions += [Stop(r.id, r.moving) for r in moved]
    return actions

"""Autoscaling on load, once a period (controlplane/rules/autoscale.py decides the count), and which
models ask for replicas now (the steps that wake, make room and keep reserved GPUs read it).

| the decision for an autoscaled model     | actions                                          |
|------------------------------------------|--------------------------------------------------|
| more replicas                            | kept: the new count; an event                    |
| fewer, a Ready replica of known use with | one fewer kept; the idlest withdrawn (safe stop) |
| nothing in flight on any router          |                                                  |
| fewer, every replica busy or unknown     | nothing stops; the reason says so                |
| either way                               | the decision and its window kept for the next    |
"""

from __future__ import annotations

from controlplane.rules.autoscale import decide
from controlplane.rules.view import LIVE, FleetView
from controlplane.vocabulary.actions import Event, SetAutoscale, SetScaled, Withdraw
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import ReplicaState


def asking(view: FleetView) -> dict[str, str]:
    """model -> why it asks for replicas now: requests waiting, or load above what its awake
    replicas carry."""
    out = {model: f"{n} request(s) waiting" for model, n in view.wanted().items()}
    if not view.autoscale:
        return out
    live_in_flight = view.idle.in_flight(view.now, live_only=True)
    for name, decision in view.autoscale.items():
        spec = view.specs.get(name)
        if spec is None or name in out:
            continue
        mine = view.replicas_of(name)
        awake = sum(1 for r in mine if r.state in LIVE)
        if view.desired(spec) > awake and any(live_in_flight.get(r.id) for r in mine):
            out[name] = f"scaling out on load ({decision['reason']})"
    return out


def autoscale(view: FleetView) -> list:
    live_in_flight = view.idle.in_flight(view.now, live_only=True)
    any_in_flight = view.idle.in_flight(view.now)
    silent = view.idle.silent_holders(list(view.replicas), view.now)
    wanted = view.wanted()
    engine_load = view.idle.engine_load(view.now)
    actions: list = []
    for spec in list(view.specs.values()):
        name = spec.name
        if not spec.autoscaled:
            if name in view.autoscale:
                actions.append(SetAutoscale(name, None))
            continue
        mine = view.replicas_of(name)
        in_flight = sum(live_in_flight.get(r.id, 0) for r in mine)
        waiting = wanted.get(name, 0)
        current = view.desired(spec)
        decision = decide(
            spec,
            current,
            sum(1 for r in mine if r.state == ReplicaState.READY),
            in_flight,
            waiting,
            view.windows.get(name),
            view.now,
            next((silent[r.id] for r in mine if r.id in silent), ""),
            sum(engine_load[r.id]["waiting"] for r in mine if r.id in engine_load),
        )
        reason = decision.reason
        if decision.replicas > current:
            actions += [
                SetScaled(name, decision.replicas),
                Event(name, f"scaled out from {current} to {decision.replicas}: {reason}"),
            ]
        elif decision.replicas < current:
            victim = idlest(view, mine, any_in_flight)
            if victim is None:
                reason += "; every replica busy or of unknown use: none stopped yet"
            else:
                actions += [
                    SetScaled(name, current - 1),
                    Withdraw(victim.id, f"scaled in: {reason}"),
                    Event(name, f"scaled in from {current} to {decision.replicas}: {reason}"),
                ]
        info = {"reason": reason, "recommended": decision.recommended, "load": in_flight + waiting}
        actions.append(SetAutoscale(name, info, decision.window))
    return actions


def idlest(view: FleetView, replicas, in_flight: dict[str, int]):
    """The replica to scale in: Ready, nothing in flight on any router, of known use, the
    longest idle; None when there is none."""
    ready = [r for r in replicas if r.state == ReplicaState.READY and not in_flight.get(r.id)]
    idle = view.idle.idle_map([r.id for r in ready], view.now)
    known = [r for r in ready if idle[r.id][1] != IdleState.UNKNOWN]
    return max(known, key=lambda r: (idle[r.id][0], r.id), default=None)

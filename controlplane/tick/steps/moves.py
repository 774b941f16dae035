"""The actions that carry out a sleep or room plan's moves (controlplane/rules/sleep.py `Move`):
shared by the steps that make room, wake and put idle replicas to sleep.

| the move                       | actions                                                 |
|--------------------------------|---------------------------------------------------------|
| sleep                          | Sleep (the safe stop, ending in sleep)                  |
| stop a Ready replica           | one fewer kept, Withdraw (the safe stop), counted as room |
| stop any other                 | one fewer kept, Stop (at once only if it had no route)  |
"""

from __future__ import annotations

from controlplane.rules.view import FleetView
from controlplane.vocabulary.actions import Counted, SetScaled, Sleep, Stop, Withdraw
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import ReplicaState
from controlplane.vocabulary.specs import format_duration as duration


def idle_words(view: FleetView, replica_id: str) -> tuple[float, str]:
    seconds, state = view.idle.idle_for(replica_id)
    bound = "≥" if state == IdleState.AT_LEAST else ""
    return seconds, f"{bound}{duration(seconds)}"


def carry_out(view: FleetView, moves) -> list:
    actions: list = []
    kept: dict[str, int] = {}  # model -> replicas kept, as these moves leave it

    def one_fewer(model: str) -> None:
        spec = view.specs.get(model)
        if spec is not None:
            kept[model] = kept.get(model, view.desired(spec)) - 1
            actions.append(SetScaled(model, kept[model]))

    for move in moves:
        replica = move.replica
        if replica is None:
            continue
        why = move.why
        if move.action == "sleep":
            seconds, words = idle_words(view, replica.id)
            if not why.startswith("idle"):
                why += f"; idle {words}"
            actions += [Sleep(replica.id, why, seconds), Counted("sleep")]
        elif replica.state == ReplicaState.READY:
            _, words = idle_words(view, replica.id)
            one_fewer(replica.model)
            actions += [Withdraw(replica.id, f"{why}; idle {words}"), Counted("room")]
        else:
            one_fewer(replica.model)
            actions.append(Stop(replica.id, why))
    return actions

"""Hot cards hand their quietest model on (controlplane/rules/rebalance.py decides which and
where). This step only marks the move; "scale, replace and drain" (models.py) starts the
replacement where the placer puts it and sends the moving replica through the safe stop once
the replacement is Ready.

| the fleet                                   | what happens                              |
|---------------------------------------------|-------------------------------------------|
| a card runs hot, a model on it may move      | it is marked moving, and why              |
| its model waits for room or is being woken   | nothing: that plan goes first             |
"""

from __future__ import annotations

from controlplane.rules.placement import hot_rate
from controlplane.rules.rebalance import plan_rebalance
from controlplane.rules.view import FleetView
from controlplane.vocabulary.actions import SetMoving


def rebalance(view: FleetView) -> list:
    rates = view.replica_rates()
    if not rates:
        return []
    busy = set(view.reservations) | set(view.room)
    specs = {name: spec for name, spec in view.specs.items() if name not in busy}
    move = plan_rebalance(
        list(view.replicas.values()),
        rates,
        view.card_load(),
        hot_rate(view.model_rates(), view.nodes.values()),
        view.placer,
        specs,
        view.now,
    )
    if move is None:
        return []
    return [SetMoving(move.replica.id, move.why)]

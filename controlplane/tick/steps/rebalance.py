"""Hot cards hand their quietest model on (controlplane/rules/rebalance.py decides which and
where). This step only marks the move; "scale, replace and drain" (models.py) starts the
replacement where the placer puts it and sends the moving replica through the safe stop once
the replacement is Ready.

| the fleet                                   | what happens                              |
|---------------------------------------------|-------------------------------------------|
| `gpuctl server` without --rebalance          | nothing (the default: see TickSettings)   |
| a card runs hot, a model on it may move      | it is marked moving, and why              |
| any model waits for room or to wake          | nothing: memory is wanted there first     |
"""

from __future__ import annotations

from controlplane.rules.placement import hot_rate
from controlplane.rules.rebalance import plan_rebalance
from controlplane.rules.view import FleetView
from controlplane.vocabulary.actions import SetMoving


def rebalance(view: FleetView) -> list:
    if not view.settings.rebalance:
        return []  # gpuctl server --rebalance
    rates = view.replica_rates()
    if not rates:
        return []
    if view.reservations or view.room or view.wanted():
        return []  # memory is wanted for a model that waits: it goes first
    specs = view.specs
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

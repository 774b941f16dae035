"""A tick's decisions, in the order they are taken.

Each step reads the fleet's view (controlplane/rules/view.py) and returns actions
(controlplane/vocabulary/actions.py); it changes nothing. The executor carries a step's actions out
before the next step reads the view, so each step sees what the steps before it decided:
that order is the one written here, and each module opens with its table of cases.

A step with `units` is taken once per unit, in that order (making room for one waiting model
sees the GPUs kept for the one before it); the units are read once, when the step begins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controlplane.rules.view import FleetView
from controlplane.tick.steps import (
    loras,
    models,
    nodes,
    rebalance,
    rooms,
    scaling,
    sleeping,
    withdrawals,
)


@dataclass(frozen=True)
class Step:
    name: str
    decide: Callable  # (view) -> actions, or (view, unit) -> actions with `units`
    units: Callable[[FleetView], Iterable] | None = None


STEPS = (
    Step("node timeouts", nodes.node_timeouts),
    Step("failed replicas expire", nodes.expired_failures),
    Step("wake and sleep timeouts", sleeping.sleep_timeouts),
    Step("demand wakes a model at zero", models.at_zero),
    Step("autoscale", scaling.autoscale),  # once a period: the reconciler paces it
    Step("place on kept GPUs", rooms.place_on_reserved, rooms.reserved_models),
    Step("wake what is asked for", sleeping.wake_asked, sleeping.asked_models),
    Step("idle replicas sleep", sleeping.sleep_idle),
    Step("idle replicas stop", models.idle_stops),
    Step("hot cards hand on their quietest model", rebalance.rebalance),
    Step("scale, replace and drain", models.models),
    Step("demand", rooms.demand),
    Step("make room", rooms.make_room, rooms.waiting_models),
    Step("orphans", nodes.orphans),
    Step("drained replicas stop", withdrawals.drained),
    Step("withdrawn sleepers sleep", withdrawals.fall_asleep),
    Step("adapters", loras.adapters),
    Step("withdrawn adapters unload", withdrawals.unloaded),
)

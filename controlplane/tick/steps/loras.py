"""Adapters (controlplane/rules/adapters.py plans the loads and unloads): the plan as actions, and
each adapter's reason kept when it changes."""

from __future__ import annotations

from controlplane.rules.adapters import AdapterInputs, plan_adapters, slot_id
from controlplane.rules.view import FleetView
from controlplane.vocabulary.actions import LoadAdapter, SetAdapterReason, UnloadAdapter


def adapters(view: FleetView) -> list:
    if not view.adapters and not any(r.want_adapters for r in view.replicas.values()):
        return []
    slots = [slot_id(r.id, name) for r in view.replicas.values() for name in r.want_adapters]
    plan = plan_adapters(
        AdapterInputs(
            adapters=dict(view.adapters),
            specs=dict(view.specs),
            replicas=list(view.replicas.values()),
            waiting=view.wanted_adapters(),
            idle=view.idle.idle_map(slots, view.now),
            in_flight=view.idle.in_flight(view.now),
        )
    )
    actions: list = [UnloadAdapter(r.id, name, why) for name, r, why in plan.unloads]
    actions += [LoadAdapter(r.id, name) for name, r in plan.loads]
    for name in view.adapters:
        reason = plan.reasons.get(name, "")
        if reason != view.adapter_reasons.get(name, ""):
            actions.append(SetAdapterReason(name, reason))
    return actions

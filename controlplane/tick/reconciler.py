"""The reconciler: one tick moves the fleet towards what the specs ask for.

A tick takes the steps of controlplane/tick/steps/ in their written order; each reads the fleet's
view and returns actions, which the executor (controlplane/tick/executor.py) carries out before
the next step reads. Then the routing table is published, and the routes it withdrew are
stamped with its version. The reconciler decides nothing itself. Time comes from the fleet's
injected clocks, so a test drives it tick by tick without sleeping.
"""

from __future__ import annotations

import time
from dataclasses import replace

from controlplane.rules.tenantshares import tenant_table
from controlplane.rules.view import FleetView, TickSettings
from controlplane.state.fleet import Fleet
from controlplane.state.routetable import RouteTable, resolvers, routing_table
from controlplane.tick.executor import Executor
from controlplane.tick.steps import STEPS

PACED = {"autoscale"}  # steps taken once a period, not at every tick a heartbeat wakes


class Reconciler:
    def __init__(
        self,
        fleet: Fleet,
        routes: RouteTable | None = None,
        node_timeout_s: float = 15.0,
        failed_retention_s: float = 600.0,
        min_residency_s: float = 120.0,
        autoscale_every_s: float = 1.0,
        room_timeout_s: float = 600.0,
        heartbeat_s: float = 2.0,
        max_heartbeats_per_s: float = 500.0,
        rebalance: bool = False,
    ) -> None:
        self.fleet = fleet
        self.routes = routes or RouteTable()
        self.settings = TickSettings(
            node_timeout_s=node_timeout_s,
            failed_retention_s=failed_retention_s,
            min_residency_s=min_residency_s,
            room_timeout_s=room_timeout_s,
            heartbeat_s=heartbeat_s,
            max_heartbeats_per_s=max_heartbeats_per_s,
            rebalance=rebalance,
        )
        # Autoscaling decides once a period, not at every tick a heartbeat wakes: "at most
        # doubling a tick" must not double again on the same reports.
        self.autoscale_every_s = autoscale_every_s
        self.autoscaled_at = float("-inf")
        self.executor = Executor(fleet)
        self.tracing = None  # controlplane/tick/tracing.py with --otlp-endpoint; else None

    @property
    def stops(self) -> dict[str, int]:
        """Replicas stopped or put to sleep, by what decided it (idle, room, sleep, operator)."""
        return self.executor.stops

    @property
    def min_residency_s(self) -> float:
        return self.settings.min_residency_s

    @min_residency_s.setter
    def min_residency_s(self, seconds: float) -> None:
        self.settings = replace(self.settings, min_residency_s=seconds)

    @property
    def room_timeout_s(self) -> float:
        return self.settings.room_timeout_s

    @room_timeout_s.setter
    def room_timeout_s(self, seconds: float) -> None:
        self.settings = replace(self.settings, room_timeout_s=seconds)

    def view(self) -> FleetView:
        return self.fleet.view(self.routes.version, self.settings)

    def _run(self, step, unit) -> None:
        """One step (for one unit, where it has units): decided on a fresh view, applied."""
        tracing = self.tracing
        began = 0 if tracing is None else time.time_ns()
        view = self.view()
        actions = step.decide(view) if unit is None else step.decide(view, unit)
        if tracing is not None and not isinstance(actions, list):
            actions = list(actions)
        self.executor.apply(view, actions)
        if tracing is not None:
            tracing.step(step.name, actions, began, self._model_of_replica)

    def _model_of_replica(self, replica_id: str) -> str | None:
        replica = self.fleet.replicas.get(replica_id)
        return replica.model if replica is not None else None

    def tick(self) -> None:
        fleet = self.fleet
        now = fleet.wall()
        autoscale_due = now - self.autoscaled_at >= self.autoscale_every_s
        if autoscale_due:
            self.autoscaled_at = now
        with fleet.store.batch():
            for step in STEPS:
                if step.name in PACED and not autoscale_due:
                    continue
                if step.units is None:
                    self._run(step, None)
                    continue
                for unit in list(step.units(self.view())):
                    self._run(step, unit)
            fleet.meter.measure(fleet.replicas.values(), fleet.specs, fleet.nodes, now)
            fleet.flush_activity()
            fleet.note_keys_used()
            fleet.flush_records()
        routes, affinity = routing_table(fleet.specs, fleet.adapters, fleet.replicas)
        self.routes.publish(
            routes,
            affinity,
            tenant_table(fleet.tenants, fleet.tenant_keys, fleet.ledger, fleet.auth_mode),
            resolvers(fleet.specs, fleet.adapters, fleet.replicas),
            sorted(fleet.adapters),
        )
        fleet.ledger.published_in(self.routes.version)
        self.executor.stamp_withdrawals(self.routes.version)
        # What this tick changed it has acted on; only news from outside wakes it again.
        fleet.changed = False

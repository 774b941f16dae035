"""The one place a tick changes the fleet: it carries out the steps' actions, in the order
each step gave them, and owns the one stop path.

The stop path: a replica that has or had a route (controlplane/rules/view.py `had_route`) is never
stopped at once, whatever asked and whatever its state: a Stop becomes a Withdraw (its route
goes, it turns Retiring), and only `Drained`, once no router holds it, makes it Stopping. The
same wait ends in sleep (`SleepEngine`) for a replica on its way to sleep. Only a replica
that never had a route stops at once.
"""

from __future__ import annotations

import logging

from controlplane.rules.view import FleetView, had_route
from controlplane.vocabulary import actions as a
from controlplane.vocabulary.model import ReplicaState

log = logging.getLogger("gpufleet.executor")
WITHDRAWN = "; route withdrawn"


class Executor:
    def __init__(self, fleet) -> None:
        self.fleet = fleet
        self.stops: dict[str, int] = {}  # stops and sleeps decided, by what decided them
        self.view: FleetView | None = None

    def apply(self, view: FleetView, actions: list) -> None:
        self.view = view
        for action in actions:
            HANDLERS[type(action)](self, action)

    def _replica(self, replica_id: str):
        return self.fleet.replicas.get(replica_id)

    # nodes and replicas

    def node_lost(self, act: a.NodeLost) -> None:
        node = self.fleet.nodes[act.node]
        node.ready = False
        self.fleet.store.put_node(node)
        self.fleet.changed = True

    def fail(self, act: a.Fail) -> None:
        replica = self._replica(act.replica)
        if replica is not None:
            replica.lost = act.lost
            self.fleet.set_replica_state(replica, ReplicaState.FAILED, act.why)

    def forget(self, act: a.Forget) -> None:
        self.fleet.remove_replica(act.replica)

    def place(self, act: a.Place) -> None:
        replica = self.fleet.add_replica(act.model, list(act.placement))
        if act.moved:
            replica.moved_in = True
            self.fleet.put_replica(replica)
        if act.swap_since is not None:
            self.fleet.swapping[replica.id] = (act.model, act.swap_since)
        if act.why:
            self.fleet.event(act.model, act.why)

    def set_moving(self, act: a.SetMoving) -> None:
        replica = self._replica(act.replica)
        if replica is None or replica.moving == act.why:
            return
        replica.moving = act.why
        self.fleet.put_replica(replica)
        self.fleet.changed = True
        if act.why:
            self.fleet.event(replica.model, f"replica {replica.id} {act.why}")

    # the one stop path

    def withdraw(self, act: a.Withdraw) -> None:
        replica = self._replica(act.replica)
        if replica is not None:
            self.fleet.set_replica_state(replica, ReplicaState.RETIRING, act.why + WITHDRAWN)

    def stop(self, act: a.Stop) -> None:
        replica = self._replica(act.replica)
        if replica is None or replica.state == ReplicaState.STOPPING:
            return
        if had_route(replica):
            if replica.state != ReplicaState.RETIRING:
                self.withdraw(a.Withdraw(act.replica, act.why))
            return
        self.fleet.set_replica_state(replica, ReplicaState.STOPPING, act.why)

    def drained(self, act: a.Drained) -> None:
        replica = self._replica(act.replica)
        if replica is None or replica.state != ReplicaState.RETIRING:
            return
        held = self.view.still_held(replica.id, replica.withdrawn_version)
        if held:  # a step that got this wrong must not cut a stream
            log.error("not stopping %s: %s", replica.id, held)
            return
        self.fleet.set_replica_state(replica, ReplicaState.STOPPING, act.why)

    def sleep(self, act: a.Sleep) -> None:
        replica = self._replica(act.replica)
        if replica is not None:
            replica.idle_at_sleep = max(0.0, act.idle_s)
            self.fleet.set_replica_state(replica, ReplicaState.SLEEPING, act.why + WITHDRAWN)

    def sleep_engine(self, act: a.SleepEngine) -> None:
        replica = self._replica(act.replica)
        if replica is None or replica.state != ReplicaState.SLEEPING or replica.sleep:
            return
        held = self.view.still_held(replica.id, replica.withdrawn_version)
        if held:
            log.error("not putting %s to sleep: %s", replica.id, held)
            return
        replica.sleep = act.level
        replica.slept_at = self.fleet.wall()
        self.fleet.set_replica_state(replica, ReplicaState.SLEEPING, act.why)

    def wake(self, act: a.Wake) -> None:
        replica = self._replica(act.replica)
        if replica is None:
            return
        if act.swap_since is not None:
            self.fleet.swapping[replica.id] = (replica.model, act.swap_since)
        replica.sleep = 0
        # It holds all its memory again from this order on (rules/held.py).
        replica.asleep_held = False
        replica.gpu_memory_used_mb = 0
        replica.moved_in = False  # a new residency: a move may take it again
        replica.woken_at = self.fleet.wall()
        self.fleet.set_replica_state(replica, ReplicaState.WAKING, act.why)

    def revive(self, act: a.Revive) -> None:
        replica = self._replica(act.replica)
        if replica is not None:
            self.fleet.set_replica_state(replica, ReplicaState.READY, act.why)

    def hold(self, act: a.Hold) -> None:
        replica = self._replica(act.replica)
        if replica is not None:
            self.fleet.set_replica_state(replica, replica.state, act.why)

    # records

    def reserve(self, act: a.Reserve) -> None:
        self.fleet.reservations[act.reservation.model] = act.reservation
        self.fleet.room[act.reservation.model] = act.room

    def release(self, act: a.Release) -> None:
        kept = self.fleet.reservations.pop(act.model, None)
        if act.why and kept is not None:
            self.fleet.room.pop(act.model, None)
            nodes = ", ".join(kept.nodes())
            self.fleet.event(act.model, f"GPUs on {nodes} no longer kept: {act.why}")

    def set_scaled(self, act: a.SetScaled) -> None:
        self.fleet.set_scaled(act.model, act.replicas)

    def set_reason(self, act: a.SetReason) -> None:
        self.fleet.set_reason(act.model, act.reason, quiet=act.quiet)

    def set_room(self, act: a.SetRoom) -> None:
        if act.room is None:
            self.fleet.room.pop(act.model, None)
        else:
            self.fleet.room[act.model] = act.room

    def set_demand_since(self, act: a.SetDemandSince) -> None:
        if act.since is None:
            self.fleet.demand_since.pop(act.model, None)
        else:
            self.fleet.demand_since[act.model] = act.since

    def set_woken(self, act: a.SetWoken) -> None:
        self.fleet.woken_at[act.model] = self.fleet.wall()

    def set_autoscale(self, act: a.SetAutoscale) -> None:
        if act.info is None:
            self.fleet.autoscale.pop(act.model, None)
            return
        self.fleet.set_window(act.model, act.window)
        self.fleet.autoscale[act.model] = act.info

    # adapters

    def load_adapter(self, act: a.LoadAdapter) -> None:
        replica = self._replica(act.replica)
        if replica is not None:
            self.fleet.load_adapter(replica, act.adapter)

    def unload_adapter(self, act: a.UnloadAdapter) -> None:
        replica = self._replica(act.replica)
        if replica is not None:
            self.fleet.unload_adapter(replica, act.adapter, act.why)

    def unloaded(self, act: a.Unloaded) -> None:
        replica = self._replica(act.replica)
        if replica is None:
            return
        replica.unloading = {k: v for k, v in replica.unloading.items() if k not in act.adapters}
        # Its engine is told to unload them now: held again only once it says so anew, so that
        # a load decided before its next report routes nothing to an adapter already gone.
        replica.adapters = [a for a in replica.adapters if a not in act.adapters]
        self.fleet.put_replica(replica)
        self.fleet.changed = True
        for name in act.adapters:
            self.fleet.event(name, f"unloaded from {replica.id}: no router holds it there")

    def set_adapter_reason(self, act: a.SetAdapterReason) -> None:
        if act.reason:
            self.fleet.adapter_reasons[act.adapter] = act.reason
            self.fleet.event(act.adapter, act.reason)
        else:
            self.fleet.adapter_reasons.pop(act.adapter, None)

    def counted(self, act: a.Counted) -> None:
        self.stops[act.kind] = self.stops.get(act.kind, 0) + 1

    def event(self, act: a.Event) -> None:
        self.fleet.event(act.model, act.message)

    # after the table is published

    def stamp_withdrawals(self, version: int) -> None:
        """Routes withdrawn in this tick are gone from the table just published: its version
        is what every live router must have acknowledged before a stop, a sleep or an unload."""
        fleet = self.fleet
        with fleet.store.batch():
            for replica in fleet.replicas.values():
                withdrawing = replica.state == ReplicaState.RETIRING or (
                    replica.state == ReplicaState.SLEEPING and not replica.sleep
                )
                stamp = withdrawing and not replica.withdrawn_version
                fresh = [k for k, v in replica.unloading.items() if not v]
                if not (stamp or fresh):
                    continue
                if stamp:
                    replica.withdrawn_version = version
                if fresh:
                    replica.unloading = {**replica.unloading, **dict.fromkeys(fresh, version)}
                fleet.put_replica(replica)


# Each action kind and the method that carries it out. Unbound, so that an executor is freed
# with its term as soon as nothing uses it (bound methods held by it would be a cycle).
HANDLERS = {
    a.NodeLost: Executor.node_lost,
    a.Fail: Executor.fail,
    a.Forget: Executor.forget,
    a.Place: Executor.place,
    a.SetMoving: Executor.set_moving,
    a.Withdraw: Executor.withdraw,
    a.Stop: Executor.stop,
    a.Drained: Executor.drained,
    a.Sleep: Executor.sleep,
    a.SleepEngine: Executor.sleep_engine,
    a.Wake: Executor.wake,
    a.Revive: Executor.revive,
    a.Hold: Executor.hold,
    a.Reserve: Executor.reserve,
    a.Release: Executor.release,
    a.SetScaled: Executor.set_scaled,
    a.SetReason: Executor.set_reason,
    a.SetRoom: Executor.set_room,
    a.SetDemandSince: Executor.set_demand_since,
    a.SetWoken: Executor.set_woken,
    a.SetAutoscale: Executor.set_autoscale,
    a.LoadAdapter: Executor.load_adapter,
    a.UnloadAdapter: Executor.unload_adapter,
    a.Unloaded: Executor.unloaded,
    a.SetAdapterReason: Executor.set_adapter_reason,
    a.Counted: Executor.counted,
    a.Event: Executor.event,
}

"""The control plane's working state and the operations that change it.

Every operation validates first, writes to the store, then changes memory: what fails
validation changes nothing, and what was acknowledged survives a restart.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace

from controlplane.adapters import Adapter, slot_id, validate_adapter
from controlplane.auth import Credentials, new_credential
from controlplane.autoscale import Window
from controlplane.histogram import SWAP_BUCKETS, WAKE_BUCKETS, Histogram
from controlplane.idle import IdleState, IdleTracker, Router
from controlplane.model import (
    GPU,
    RESIDENT,
    SELF_WAKING,
    ModelSpec,
    Node,
    Replica,
    ReplicaState,
    Schedulable,
    SpecError,
    validate_spec,
)
from controlplane.records import ModelRecords, Reservation
from controlplane.redact import keep_stored
from controlplane.sleep import Memory, memory_of
from controlplane.store import Store
from controlplane.view import FleetView, TickSettings, desired, held_gpus, reserved_gpus

EVENTS_PER_MODEL = 50


class NotFound(LookupError):
    pass


class Conflict(Exception):
    pass


class BadRequest(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass
class FleetSnapshot:
    """One consistent view: the summary and every table are computed from the same one."""

    nodes: list[Node]
    replicas: list[Replica]
    specs: list[ModelSpec]
    reasons: dict[str, str]  # model -> why some replicas cannot be placed
    idle: dict[str, tuple[float, IdleState]]
    now: float  # wall clock
    route_version: int = 0
    routers: list[dict] = field(default_factory=list)
    unknown_by_silence: set[str] = field(default_factory=set)  # replicas a silent router has
    desired: dict[str, int] = field(default_factory=dict)  # model -> replicas kept now
    waiting: dict[str, int] = field(default_factory=dict)  # model -> requests held by routers
    # model -> {"reason", "victims", "final"}: waiting for room, or told it will get none
    room: dict[str, dict] = field(default_factory=dict)
    swaps: list[tuple[float, str, float]] = field(default_factory=list)  # (at, model, seconds)
    autoscale: dict[str, dict] = field(default_factory=dict)  # model -> the last decision
    adapters: list[Adapter] = field(default_factory=list)
    adapter_reasons: dict[str, str] = field(default_factory=dict)  # adapter -> why not loaded
    # slot_id(replica, adapter) -> idle, for every adapter a replica holds
    adapter_idle: dict[str, tuple[float, IdleState]] = field(default_factory=dict)


REPLICA_REPORT_STATES = {
    "Starting",
    "Ready",
    "Unhealthy",
    "Failed",
    "Stopping",
    "Stopped",
    "Asleep",  # its engine sleeps (told to, or by itself)
    "Waking",  # told to wake, not yet healthy
}
SWAPS_KEPT = 1000


class Fleet:
    def __init__(
        self, store: Store, idle: IdleTracker | None = None, clock=time.monotonic, wall=time.time
    ) -> None:
        self.store = store
        self.clock = clock
        self.wall = wall
        self.idle = idle or IdleTracker(clock=wall)
        specs, nodes, replicas, last_used = store.load()
        self.specs: dict[str, ModelSpec] = specs
        self.nodes: dict[str, Node] = nodes
        self.replicas: dict[str, Replica] = replicas
        # node -> ids of the replicas placed on it: a heartbeat looks at its node's only.
        self.on_node: dict[str, dict[str, None]] = {}  # dicts as ordered sets
        # model -> ids of its replicas: a tick looks at each model's own, not at every replica
        # once per model (1,000 models x 10,000 replicas held the loop for seconds).
        self.of_model: dict[str, dict[str, None]] = {}
        for replica in replicas.values():
            self._index(replica)
        self.reasons: dict[str, str] = {}
        self.events: dict[str, deque] = {}
        self.leaving_specs: dict[str, ModelSpec] = {}  # deleted models' specs, while they stop
        # model -> replicas kept now, when idleness brought it below its spec's `replicas`
        self.scaled: dict[str, int] = store.load_scaled()
        # What the leader acts on between ticks, kept as records (controlplane/records.py)
        # written once a tick: a new leader goes on from them.
        self.records = ModelRecords(store.load_records())
        kept = self.records.loaded()
        # model -> when requests last woke it: a wake counts as a use of the model, so what
        # woke is not stopped again before it had the time to serve them
        self.woken_at: dict[str, float] = kept["woken_at"]
        # Making room (controlplane/room.py): model -> when requests began to wait for it, and
        # when a router last said so; what is reserved for whom; why a model gets no room.
        self.demand_since: dict[str, float] = kept["demand_since"]
        self.demanded_at: dict[str, float] = kept["demanded_at"]
        self.reservations: dict[str, Reservation] = kept["reservation"]
        self.room: dict[str, dict] = {}
        self.swapping: dict[str, tuple[str, float]] = {}  # replica -> (model, demand since)
        self.swaps: deque = deque(maxlen=SWAPS_KEPT)  # (at, model, demand-to-Ready seconds)
        self.swap_totals: dict[str, int] = kept["swaps"]
        self.swap_seconds = Histogram(SWAP_BUCKETS)
        # Sleeping engines (controlplane/sleep.py): model -> sleeps and wakes; wake seconds.
        self.sleep_totals: dict[str, int] = kept["sleeps"]
        self.wake_totals: dict[str, int] = kept["wakes"]
        # LoRA adapters (controlplane/adapters.py): the operator's objects, and loads and
        # unloads counted per adapter.
        self.adapters: dict[str, Adapter] = kept["adapter"]
        self.adapter_loads: dict[str, int] = kept["adapter_loads"]
        self.adapter_unloads: dict[str, int] = kept["adapter_unloads"]
        self.adapter_reasons: dict[str, str] = {}  # adapter -> why it is not loaded
        self.wake_seconds = Histogram(WAKE_BUCKETS)
        # Autoscaling (controlplane/autoscale.py): model -> its recommendation window, kept in
        # the store; and what the last decision said and was, for `gpuctl models` and /metrics.
        self.windows: dict[str, Window] = {
            model: Window.from_dict(body) for model, body in store.load_windows().items()
        }
        self.autoscale: dict[str, dict] = {}  # model -> {"reason", "recommended", "load"}
        # node -> SHA-256 of its agent's credential, bound at registration (controlplane/auth)
        self.credentials = Credentials(store.load_credentials())
        routers, gaps = store.load_routers()
        self.idle.load(last_used, [Router.from_dict(r) for r in routers], gaps)
        started = clock()
        for node in self.nodes.values():
            # A restarted control plane gives every node one timeout to be heard from again.
            node.last_heartbeat = started
        self.version = 0
        self.changed = True  # tells the reconciler to look again

    @property
    def changed(self) -> bool:
        """Whether the state changed since the reconciler last looked; each change also moves
        `version`, by which readers know their views are current."""
        return self._changed

    @changed.setter
    def changed(self, value: bool) -> None:
        if value:
            self.version += 1
        self._changed = value

    # specs

    def event(self, model: str, message: str) -> None:
        """What happened to a model, for `gpuctl models NAME` (kept in memory, the newest 50)."""
        self.events.setdefault(model, deque(maxlen=EVENTS_PER_MODEL)).append((self.wall(), message))

    def apply(self, body, dry_run: bool = False) -> tuple[ModelSpec, str]:
        """Create or update a model; returns the stored spec and created/configured/unchanged.
        `dry_run`: validate and say what would happen, store nothing."""
        try:
            named = body.get("name") if isinstance(body, dict) else None
            body = keep_stored(body, self.specs.get(named) if isinstance(named, str) else None)
            spec = validate_spec(body)
        except SpecError as exc:
            raise BadRequest(exc.field, exc.message) from None
        if spec.name in self.adapters:
            raise BadRequest(
                "name", f"an adapter is named {spec.name}: requests name one or the other"
            )
        current = self.specs.get(spec.name)
        outcome = next_generation("model", spec, current, body)
        if outcome == "unchanged":
            return current, outcome
        if dry_run:
            return spec, outcome
        self.store.put_spec(spec)
        self.specs[spec.name] = spec
        self.leaving_specs.pop(spec.name, None)
        if spec.autoscaled and current is not None and current.autoscaled:
            # An edit of an autoscaled model keeps what its load asked for, within the new
            # bounds: resetting it to `replicas` would stop replicas that are serving.
            kept = self.scaled.get(spec.name)
            if kept is not None:
                self.set_scaled(spec.name, min(max(kept, spec.floor), spec.ceiling))
        else:
            self.set_scaled(spec.name, None)
        self.changed = True
        self.event(spec.name, f"spec {outcome} (generation {spec.generation})")
        return spec, outcome

    def delete(self, name: str) -> ModelSpec:
        spec = self.spec(name)
        riding = sorted(a.name for a in self.adapters.values() if a.base == name)
        if riding:
            raise Conflict(
                f"adapters use model {name} as their base ({', '.join(riding[:5])}"
                + (f" and {len(riding) - 5} more" if len(riding) > 5 else "")
                + "): delete them first"
            )
        self.store.delete_spec(name)
        del self.specs[name]
        if self.of_model.get(name):
            # Its replicas stop through the safe stop: their agents run them on this spec till
            # then (kept in memory only: a restarted leader lets them go at once).
            self.leaving_specs[name] = spec
        self.reasons.pop(name, None)
        self.events.pop(name, None)
        self.scaled.pop(name, None)
        self.reservations.pop(name, None)
        self.room.pop(name, None)
        self.windows.pop(name, None)
        self.autoscale.pop(name, None)
        self.demand_since.pop(name, None)
        self.demanded_at.pop(name, None)
        self.woken_at.pop(name, None)
        self.swap_totals.pop(name, None)
        self.sleep_totals.pop(name, None)
        self.wake_totals.pop(name, None)
        self.changed = True
        return spec

    def scale(self, name: str, replicas, generation=None) -> ModelSpec:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise BadRequest("replicas", "must be a non-negative integer")
        spec = self.spec(name)
        if generation and generation != spec.generation:
            raise Conflict(f"model {name} is at generation {spec.generation}, not {generation}")
        if spec.autoscaled and not spec.floor <= replicas <= spec.ceiling:
            raise BadRequest(
                "replicas",
                f"model {name} autoscales between min_replicas {spec.floor} and max_replicas"
                f" {spec.ceiling}: scale it within them (the point it starts from), or apply"
                " new bounds",
            )
        if spec.replicas == replicas:
            # The operator's count again, wherever load or idleness took it: a model scaled to
            # zero by idleness starts again.
            if name in self.scaled:
                self.set_scaled(name, None)
                self.event(name, f"scaled to {replicas} replica(s)")
            return spec
        updated = ModelSpec(
            **{**spec.to_dict(), "replicas": replicas, "generation": spec.generation + 1}
        )
        self.store.put_spec(updated)
        self.specs[name] = updated
        self.set_scaled(name, None)
        self.changed = True
        self.event(name, f"scaled from {spec.replicas} to {replicas} replica(s)")
        return updated

    def spec(self, name: str) -> ModelSpec:
        try:
            return self.specs[name]
        except KeyError:
            raise NotFound(f"model {name} not found") from None

    # adapters

    def apply_adapter(self, body, dry_run: bool = False) -> tuple[Adapter, str]:
        """Create or update an adapter; stored before the answer. Nothing restarts: its
        holders load it again from a new source once the old one is unloaded."""
        try:
            adapter = validate_adapter(body, self.specs)
        except SpecError as exc:
            raise BadRequest(exc.field, exc.message) from None
        current = self.adapters.get(adapter.name)
        outcome = next_generation("adapter", adapter, current, body)
        if outcome == "unchanged":
            return current, outcome
        if dry_run:
            return adapter, outcome
        if current is not None and (current.source, current.base) != (adapter.source, adapter.base):
            # Loaded from the old source, or on the old base: unloaded, then loaded anew.
            for replica in self.replicas.values():
                if adapter.name in replica.want_adapters:
                    self.unload_adapter(replica, adapter.name, "its source or base changed")
        for replica in self.replicas.values():
            if adapter.name in replica.adapter_failures:  # applied again: worth a new try
                replica.adapter_failures = {
                    k: v for k, v in replica.adapter_failures.items() if k != adapter.name
                }
                self.store.put_replica(replica)
        self.adapters[adapter.name] = adapter
        self.flush_records()
        self.changed = True
        self.event(adapter.name, f"adapter {outcome} (generation {adapter.generation})")
        return adapter, outcome

    def adapter(self, name: str) -> Adapter:
        try:
            return self.adapters[name]
        except KeyError:
            raise NotFound(f"adapter {name} not found") from None

    def delete_adapter(self, name: str) -> Adapter:
        """Gone from the routes now; each holder unloads it once its routers have dropped it."""
        adapter = self.adapter(name)
        del self.adapters[name]
        for replica in self.replicas.values():
            if name in replica.want_adapters:
                self.unload_adapter(replica, name, "adapter deleted")
        for kept in (self.adapter_loads, self.adapter_unloads, self.demand_since,
                     self.demanded_at):  # fmt: skip
            kept.pop(name, None)
        self.adapter_reasons.pop(name, None)
        self.events.pop(name, None)
        self.flush_records()
        self.changed = True
        return adapter

    def load_adapter(self, replica: Replica, name: str) -> None:
        replica.want_adapters = [*replica.want_adapters, name]
        replica.adapter_failures = {k: v for k, v in replica.adapter_failures.items() if k != name}
        self.store.put_replica(replica)
        self.adapter_loads[name] = self.adapter_loads.get(name, 0) + 1
        self.changed = True
        self.event(name, f"loading on {replica.id}")

    def unload_adapter(self, replica: Replica, name: str, why: str) -> None:
        """The safe stop of an adapter on one replica: its route there goes now; the engine
        unloads it once no router may route to it there (the reconciler's
        `_unload_withdrawn`)."""
        replica.want_adapters = [a for a in replica.want_adapters if a != name]
        if name in replica.adapters and name not in replica.unloading:
            replica.unloading = {**replica.unloading, name: 0}  # stamped once published
        self.store.put_replica(replica)
        self.adapter_unloads[name] = self.adapter_unloads.get(name, 0) + 1
        self.changed = True
        self.event(name, f"unloading from {replica.id}: {why}; route withdrawn")

    def adapter_demand(self, name: str, waiting: int) -> Adapter:
        adapter = self.adapter(name)
        if waiting > 0:
            now = self.wall()
            self.demanded_at[name] = now
            self.demand_since.setdefault(name, now)
        return adapter

    def wanted_adapters(self) -> dict[str, int]:
        return self.view().wanted_adapters()

    # nodes

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise NotFound(f"node {name} not found") from None

    def register(self, body) -> Node:
        node = parse_node(body)
        current = self.nodes.get(node.name)
        if current is not None:
            node.schedulable = current.schedulable  # operator states survive re-registration
        node.ready = True
        node.last_heartbeat = self.clock()
        self.store.put_node(node)
        self.nodes[node.name] = node
        self.changed = True
        return node

    def issue_credential(self, name: str) -> str:
        """A new credential bound to node `name`: returned once, kept as its digest."""
        token, kept = new_credential()
        self.keep_credential(name, kept)
        return token

    def keep_credential(self, name: str, kept: str) -> None:
        """Bind the credential whose SHA-256 is `kept` to node `name`."""
        self.store.put_credential(name, kept)
        self.credentials[name] = kept

    def delete_node(self, name: str) -> Node:
        """An operator removes a node: its credential is revoked (the agent, if it still runs,
        is refused from now on); the next tick fails its replicas, and their models place
        others (controlplane/steps/nodes.py)."""
        node = self.node(name)
        self.store.delete_node(name)
        del self.nodes[name]
        self.credentials.pop(name)
        self.changed = True
        return node

    def set_schedulable(self, name: str, state: Schedulable) -> Node:
        node = self.node(name)
        if node.schedulable != state:
            node.schedulable = state
            self.store.put_node(node)
            self.changed = True
        return node

    def heartbeat(self, name: str, body) -> list[dict]:
        """An agent's heartbeat: GPU health and its replicas' states; returns its assignments."""
        node = self.node(name)
        if not isinstance(body, dict):
            raise BadRequest("heartbeat", "expected a JSON object")
        gpus = body.get("gpus", None)
        reports = body.get("replicas", {})
        if gpus is not None:
            health = parse_gpu_health(gpus)
        if not isinstance(reports, dict):
            raise BadRequest("replicas", "expected a map of replica id to its state")
        for replica_id, report in reports.items():
            if not isinstance(report, dict) or report.get("state") not in REPLICA_REPORT_STATES:
                raise BadRequest(
                    f"replicas.{replica_id}.state",
                    f"one of {', '.join(sorted(REPLICA_REPORT_STATES))}",
                )
            loaded, failed = report.get("adapters", []), report.get("adapter_failures", {})
            if not isinstance(loaded, list) or not all(isinstance(a, str) for a in loaded):
                raise BadRequest(f"replicas.{replica_id}.adapters", "a list of adapter names")
            if not isinstance(failed, dict):
                raise BadRequest(
                    f"replicas.{replica_id}.adapter_failures", "a map of adapter name to reason"
                )
        with self.store.batch():
            changed_node = False
            if gpus is not None:
                # A new list of new GPUs, never a change in place: snapshots share the old one.
                fresh = [
                    gpu
                    if health.get(gpu.index, (gpu.healthy, gpu.reason)) == (gpu.healthy, gpu.reason)
                    else replace(gpu, healthy=health[gpu.index][0], reason=health[gpu.index][1])
                    for gpu in node.gpus
                ]
                if any(a is not b for a, b in zip(fresh, node.gpus, strict=True)):
                    node.gpus = fresh
                    changed_node = True
            if not node.ready:
                node.ready = True
                changed_node = True
            if changed_node:
                self.store.put_node(node)
                self.changed = True
            node.last_heartbeat = self.clock()
            for replica_id, report in reports.items():
                self._replica_report(node, replica_id, report)
            self._forget_stopped(node, reports)
        return self.assignments(name)

    def _replica_report(self, node: Node, replica_id: str, report: dict) -> None:
        replica = self.replicas.get(replica_id)
        if replica is None or node.name not in replica.nodes:
            return  # an agent's leftover: it is not assigned, the agent will stop it
        leader = replica.placement[0].node == node.name
        if replica.state == ReplicaState.FAILED and replica.lost and leader:
            self._back_with_node(node, replica, report)
        if replica.state in (ReplicaState.STOPPING, ReplicaState.FAILED):
            return
        if leader:
            self._adapter_report(replica, report)
        if replica.state == ReplicaState.RETIRING and report["state"] not in ("Failed", "Stopped"):
            return  # Ready as far as its agent knows; retiring as far as the fleet goes
        state = report["state"]
        if leader:
            state = self._self_sleep_report(replica, state)
        if state not in ("Failed", "Stopped") and self._sleep_report(replica, state, leader):
            return
        if state == "Failed" or (state == "Stopped" and replica.state != ReplicaState.STOPPING):
            replica.state = ReplicaState.FAILED
            replica.exit_code = report.get("exit_code")
            replica.reason = str(report.get("reason") or "the engine process exited")[:500]
            replica.log_tail = str(report.get("log_tail") or "")[-4000:]
        elif leader and state in ("Starting", "Ready", "Unhealthy"):
            url = report.get("url") or replica.url
            if (replica.state, replica.url) == (ReplicaState(state), url):
                return
            if state == "Ready" and replica.state != ReplicaState.READY:
                replica.ready_at = self.wall()
                self._swapped_in(replica)
            replica.state = ReplicaState(state)
            replica.url = url if isinstance(url, str) else ""
            replica.reason = str(report.get("reason") or "")[:500]
        else:
            return
        replica.updated_at = self.wall()
        self.store.put_replica(replica)
        self.changed = True
        self.event(
            replica.model,
            f"replica {replica.id} {replica.state}"
            + (f": {replica.reason}" if replica.reason else ""),
        )

    def _back_with_node(self, node: Node, replica: Replica, report: dict) -> None:
        """A replica lost with its node, whose engine its agent still runs: it is what its
        agent says again, never stopped on the spot (routers that could still reach the node
        may be streaming from it); its model's count keeps it or stops it (before the replica
        that replaced it), through the safe stop where it had a route."""
        if report["state"] not in ("Starting", "Ready", "Unhealthy"):
            return
        replica.state = ReplicaState(report["state"])
        if replica.state == ReplicaState.READY and not replica.ready_at:
            replica.ready_at = self.wall()
        url = report.get("url") or replica.url
        replica.url = url if isinstance(url, str) else ""
        replica.reason = f"back with node {node.name}"
        replica.updated_at = self.wall()
        self.store.put_replica(replica)
        self.changed = True
        self.event(replica.model, f"replica {replica.id} {replica.state}: {replica.reason}")

    def _adapter_report(self, replica: Replica, report: dict) -> None:
        """What the engine holds, and why a load failed: stored when it changed."""
        loaded = report.get("adapters")
        failures = report.get("adapter_failures") or {}
        if loaded is None:
            return
        loaded = sorted(str(a) for a in loaded)
        # Kept here, not only by the agent: a failed load stays failed on this replica until
        # the adapter is applied again, so that nothing retries it in a loop.
        failures = {
            **replica.adapter_failures,
            **{str(k): str(v)[:300] for k, v in failures.items()},
        }
        if (loaded, failures) == (sorted(replica.adapters), replica.adapter_failures):
            return
        for name, why in failures.items():
            if name not in replica.adapter_failures:
                self.event(name, f"failed to load on {replica.id}: {why}")
        gone = set(replica.adapters) - set(loaded)
        replica.unloading = {a: v for a, v in replica.unloading.items() if a not in gone}
        # A failed load is not tried again there: the step leaves that replica out.
        replica.want_adapters = [a for a in replica.want_adapters if a not in failures]
        replica.adapters, replica.adapter_failures = loaded, failures
        self.store.put_replica(replica)
        self.changed = True

    def _self_sleep_report(self, replica: Replica, state: str) -> str:
        """An engine that sleeps by itself (llama.cpp) and wakes on the next request is Ready
        asleep or awake: the flag is news for operators, not for routing, room or idleness.
        Returns the state to act on."""
        spec = self.specs.get(replica.model)
        if spec is None or spec.engine not in SELF_WAKING or state not in ("Ready", "Asleep"):
            return state
        asleep = state == "Asleep"
        if asleep != replica.engine_asleep:
            replica.engine_asleep = asleep
            self.store.put_replica(replica)
            self.changed = True
            news = "asleep by itself" if asleep else "woken by a request"
            self.event(replica.model, f"replica {replica.id} {news}")
        return "Ready"

    def _sleep_report(self, replica: Replica, state: str, leader: bool) -> bool:
        """Take what an agent says of an engine the fleet puts to sleep; True when that is all
        there was to it (the report says nothing the fleet acts on, or the fleet acted on it
        here)."""
        sleep_states = (ReplicaState.SLEEPING, ReplicaState.ASLEEP, ReplicaState.WAKING)
        if replica.state not in sleep_states:
            return state in ("Asleep", "Waking")  # an engine catching up with its orders
        if not leader:
            return True
        if replica.state == ReplicaState.SLEEPING and replica.sleep and state == "Asleep":
            self.set_replica_state(replica, ReplicaState.ASLEEP, f"asleep at level {replica.sleep}")
            self.sleep_totals[replica.model] = self.sleep_totals.get(replica.model, 0) + 1
        elif replica.state == ReplicaState.WAKING and state == "Ready":
            seconds = self.wall() - replica.woken_at
            self.wake_seconds.observe(seconds)
            self.wake_totals[replica.model] = self.wake_totals.get(replica.model, 0) + 1
            replica.ready_at = self.wall()
            self._swapped_in(replica)
            self.set_replica_state(replica, ReplicaState.READY, f"woken in {seconds:.1f}s")
        return True

    def _forget_stopped(self, node: Node, reports: dict) -> None:
        """A Stopping replica whose agents no longer run it is gone."""
        for replica_id in list(self.on_node.get(node.name, ())):
            replica = self.replicas[replica_id]
            if replica.state != ReplicaState.STOPPING:
                continue
            if replica.id not in reports or reports[replica.id]["state"] == "Stopped":
                self.remove_replica(replica.id)

    def assignments(self, name: str) -> list[dict]:
        """What the agent of `name` must run: one entry per replica slice on that node."""
        self.node(name)
        out = []
        for replica_id in self.on_node.get(name, ()):
            replica = self.replicas[replica_id]
            if replica.state not in RESIDENT or replica.state == ReplicaState.STOPPING:
                continue
            spec = self.specs.get(replica.model) or self.leaving_specs.get(replica.model)
            if spec is None:
                continue
            for rank, piece in enumerate(replica.placement):
                if piece.node != name:
                    continue
                leader = self.nodes.get(replica.placement[0].node)
                out.append(
                    {
                        "sleep": replica.sleep,
                        "adapters": self._adapters_held(replica),
                        "engine": spec.engine,
                        "engine_endpoints": spec.engine_endpoints,
                        "gpu_memory_utilization": self._memory_share(spec, piece),
                        "replica": replica.id,
                        "model": replica.model,
                        "command": spec.command,
                        "env": spec.env,
                        "env_from": spec.env_from,
                        "health_path": spec.health_path,
                        "gpus": piece.gpus,
                        "rank": rank,
                        "nnodes": len(replica.placement),
                        "master_addr": leader.address if leader else "",
                    }
                )
        return out

    def _adapters_held(self, replica: Replica) -> list[dict]:
        """What the engine must hold: what it serves, and what it unloads only once every
        router has dropped the route (a deleted adapter's source no longer matters)."""
        names = [*replica.want_adapters, *replica.unloading]
        return [
            {"name": name, "source": self.adapters[name].source if name in self.adapters else ""}
            for name in names
        ]

    def _memory_share(self, spec: ModelSpec, piece) -> str:
        """The share of each card the engine may take awake, for {gpu_memory_utilization}:
        what the spec asks for, of the smallest card it runs on."""
        node = self.nodes.get(piece.node)
        cards = [g.memory_mb for g in (node.gpus if node else []) if g.index in piece.gpus]
        smallest = min((mb for mb in cards if mb > 0), default=0)
        if not smallest:
            return "0.9"
        return f"{min(spec.awake_mb(smallest) / smallest, 1.0):.2f}"

    # replicas

    def add_replica(self, model: str, placement) -> Replica:
        now = self.wall()
        replica = Replica(
            id=f"{model}-{uuid.uuid4().hex[:8]}",
            model=model,
            placement=placement,
            created_at=now,
            updated_at=now,
        )
        self.store.put_replica(replica)
        self.replicas[replica.id] = replica
        self._index(replica)
        self.changed = True
        self.event(model, f"replica {replica.id} placed on {', '.join(replica.nodes)}")
        return replica

    def _index(self, replica: Replica) -> None:
        for node in replica.nodes:
            self.on_node.setdefault(node, {})[replica.id] = None
        self.of_model.setdefault(replica.model, {})[replica.id] = None

    def replicas_of(self, model: str) -> list[Replica]:
        return [self.replicas[rid] for rid in self.of_model.get(model, ())]

    # acting on idle

    def desired(self, spec: ModelSpec) -> int:
        return desired(spec, self.scaled)

    def set_window(self, model: str, window: Window | None) -> None:
        if self.windows.get(model) == window:
            return
        if window is None:
            self.windows.pop(model, None)
        else:
            self.windows[model] = window
        self.store.put_window(model, None if window is None else window.to_dict())

    def set_scaled(self, model: str, replicas: int | None) -> None:
        """Keep `replicas` of `model` for now (None: as its spec says)."""
        if self.scaled.get(model) == replicas:
            return
        if replicas is None:
            self.scaled.pop(model, None)
        else:
            self.scaled[model] = replicas
        self.store.put_scaled(model, replicas)
        self.changed = True

    def retire(self, replica: Replica, why: str) -> None:
        """Stop an idle replica safely, one fewer kept: see `withdraw`."""
        spec = self.specs[replica.model]
        self.set_scaled(replica.model, self.desired(spec) - 1)
        self.withdraw(replica, why)

    def withdraw(self, replica: Replica, why: str) -> None:
        """The one safe stop of a Ready replica: its route goes now; it stops once every live
        router has dropped it and has nothing in flight on it (the reconciler's
        `_stop_retired`)."""
        self.set_replica_state(replica, ReplicaState.RETIRING, why)

    def put_to_sleep(self, replica: Replica, why: str, idle_s: float) -> None:
        """The safe stop, ending in sleep: its route goes now; once every live router has
        dropped it and has nothing in flight on it, its engine is told to sleep (the
        reconciler's `_sleep_withdrawn`). `idle_s`: how long it has gone unused."""
        replica.idle_at_sleep = max(0.0, idle_s)
        self.set_replica_state(replica, ReplicaState.SLEEPING, f"{why}; route withdrawn")

    def wake(self, replica: Replica, why: str) -> None:
        """Tell a sleeper's engine to wake: Ready again once its health answers."""
        replica.sleep = 0
        replica.woken_at = self.wall()
        self.set_replica_state(replica, ReplicaState.WAKING, why)

    def demand(self, model: str, waiting: int) -> ModelSpec:
        """A router holds `waiting` requests for `model`, which has no ready replica: kept as
        a record; the next tick wakes a model at zero (controlplane/steps/models.py)."""
        spec = self.spec(model)
        if waiting > 0:
            now = self.wall()
            self.demanded_at[model] = now
            self.demand_since.setdefault(model, now)
            self.changed = True
        return spec

    def wanted(self) -> dict[str, int]:
        return self.view().wanted()

    def reserved_gpus(self, but_for: str | None = None) -> dict[tuple[str, int], str]:
        return reserved_gpus(self.reservations, but_for)

    def _swapped_in(self, replica: Replica) -> None:
        """A replica placed on room made for it is Ready: the swap is done."""
        swap = self.swapping.pop(replica.id, None)
        if swap is None:
            return
        model, since = swap
        now = self.wall()
        self.swaps.append((now, model, now - since))
        self.swap_seconds.observe(now - since)
        self.swap_totals[model] = self.swap_totals.get(model, 0) + 1

    def set_reason(self, model: str, reason: str, quiet: bool = False) -> None:
        """Why some of `model`'s replicas cannot be placed ("" once they all are). `quiet`: the
        same news in new words (a blocker's age): no event."""
        before = self.reasons.get(model, "")
        if reason == before:
            return
        if reason:
            self.reasons[model] = reason
            if not quiet:
                self.event(model, reason)
        else:
            del self.reasons[model]
            self.event(model, "every replica placed")

    def set_replica_state(self, replica: Replica, state: ReplicaState, reason: str = "") -> None:
        if state == ReplicaState.READY:
            replica.withdrawn_version = 0  # routed again: a later withdrawal is stamped anew
        replica.state = state
        replica.reason = reason
        replica.updated_at = self.wall()
        self.store.put_replica(replica)
        self.changed = True
        self.event(
            replica.model, f"replica {replica.id} {state}" + (f": {reason}" if reason else "")
        )

    def remove_replica(self, replica_id: str) -> None:
        self.store.delete_replica(replica_id)
        replica = self.replicas.pop(replica_id, None)
        for node in replica.nodes if replica is not None else ():
            self.on_node.get(node, {}).pop(replica_id, None)
        if replica is not None:
            mine = self.of_model.get(replica.model, {})
            mine.pop(replica_id, None)
            if not mine:
                self.of_model.pop(replica.model, None)
                self.leaving_specs.pop(replica.model, None)
        self.idle.forget_replica(replica_id)
        self.changed = True

    def flush_activity(self) -> None:
        """Write what routers reported since the last flush (once a tick, not per report)."""
        dirty = self.idle.take_dirty()
        if dirty:
            self.store.put_last_used(dirty)
        routers, removed, gaps = self.idle.take_dirty_routers()
        if routers or removed or gaps:
            self.store.put_routers([r.to_dict() for r in routers], removed, gaps)

    def flush_records(self) -> None:
        """Write the leader's per-model records that changed (once a tick)."""
        self.records.flush(
            self.store,
            {
                "reservation": self.reservations,
                "demand_since": self.demand_since,
                "demanded_at": self.demanded_at,
                "woken_at": self.woken_at,
                "swaps": self.swap_totals,
                "sleeps": self.sleep_totals,
                "wakes": self.wake_totals,
                "adapter": self.adapters,
                "adapter_loads": self.adapter_loads,
                "adapter_unloads": self.adapter_unloads,
            },
        )

    def held_gpus(self) -> set[tuple[str, int]]:
        """GPUs an awake engine holds."""
        return held_gpus(self.replicas.values())

    def sleepers(self) -> Memory:
        """What sleeping engines keep of each card's memory and each node's host memory."""
        return memory_of(list(self.replicas.values()), self.specs, self.nodes)

    def view(self, route_version: int = 0, settings: TickSettings | None = None) -> FleetView:
        """What a tick's steps read (controlplane/view.py): the tables themselves, not copies."""
        return FleetView(
            nodes=self.nodes,
            replicas=self.replicas,
            specs=self.specs,
            idle=self.idle,
            now=self.wall(),
            clock=self.clock(),
            adapters=self.adapters,
            scaled=self.scaled,
            reservations=self.reservations,
            room=self.room,
            reasons=self.reasons,
            demand_since=self.demand_since,
            demanded_at=self.demanded_at,
            woken_at=self.woken_at,
            windows=self.windows,
            autoscale=self.autoscale,
            adapter_reasons=self.adapter_reasons,
            on_node=self.on_node,
            of_model=self.of_model,
            route_version=route_version,
            settings=settings or TickSettings(),
        )

    # views

    def snapshot(self, route_version: int = 0) -> FleetSnapshot:
        """Every view of the routers is taken at one `now`: a router read live by one view and
        silent by the next would make the summary and the tables disagree."""
        replicas = [r.copy() for r in self.replicas.values()]
        ids = [r.id for r in replicas]
        now = self.wall()
        return FleetSnapshot(
            nodes=[n.copy() for n in self.nodes.values()],
            replicas=replicas,
            specs=[s.copy() for s in self.specs.values()],
            reasons=dict(self.reasons),
            idle=self.idle.idle_map(ids, now),
            routers=self.idle.router_rows(now),
            unknown_by_silence=self.idle.unknown_because_silent(ids, now),
            desired={name: self.desired(spec) for name, spec in self.specs.items()},
            waiting=self.idle.waiting(now),
            room={model: dict(room) for model, room in self.room.items()},
            autoscale={model: dict(a) for model, a in self.autoscale.items()},
            swaps=list(self.swaps),
            now=now,
            route_version=route_version,
            adapters=[replace(a) for a in self.adapters.values()],
            adapter_reasons=dict(self.adapter_reasons),
            adapter_idle=self.idle.idle_map(
                [slot_id(r.id, a) for r in replicas for a in r.want_adapters], now
            ),
        )


def next_generation(kind: str, new, current, body) -> str:
    """Give `new` (a spec or an adapter) the generation after `current` (None: it is created)
    and say what applying it does: created, configured or unchanged. Conflict when the change
    was made against another generation than the stored one."""
    expected = body.get("generation") if isinstance(body, dict) else None
    if expected and current is not None and expected != current.generation:
        raise Conflict(
            f"{kind} {new.name} is at generation {current.generation}, the "
            f"change was made against {expected}: read it again and re-apply"
        )
    if expected and current is None:
        raise Conflict(f"{kind} {new.name} does not exist any more (deleted meanwhile)")
    if current is not None:
        new.generation = current.generation
        if new.to_dict() == current.to_dict():
            return "unchanged"
    new.generation = (current.generation if current else 0) + 1
    return "configured" if current else "created"


def parse_node(body) -> Node:
    if not isinstance(body, dict):
        raise BadRequest("node", "expected a JSON object")
    for name in ("name", "address", "fabric"):
        if not isinstance(body.get(name), str) or not body[name]:
            raise BadRequest(name, "required, a non-empty string")
    gpus = body.get("gpus")
    if not isinstance(gpus, list):
        raise BadRequest("gpus", "required, a list")
    parsed = []
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise BadRequest(f"gpus[{i}]", "expected an object")
        index, uuid_, gpu_class = gpu.get("index"), gpu.get("uuid"), gpu.get("gpu_class")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise BadRequest(f"gpus[{i}].index", "a non-negative integer")
        if not isinstance(uuid_, str) or not isinstance(gpu_class, str) or not gpu_class:
            raise BadRequest(f"gpus[{i}]", "uuid and gpu_class are required strings")
        parsed.append(
            GPU(
                index=index,
                uuid=uuid_,
                gpu_class=gpu_class,
                memory_mb=int(gpu.get("memory_mb") or 0),
                healthy=bool(gpu.get("healthy", True)),
                reason=str(gpu.get("reason") or ""),
            )
        )
    if len({g.index for g in parsed}) != len(parsed):
        raise BadRequest("gpus", "two GPUs have the same index")
    labels = body.get("labels") or {}
    if not isinstance(labels, dict):
        raise BadRequest("labels", "a map of strings")
    host_memory = body.get("host_memory_mb", 0)
    if isinstance(host_memory, bool) or not isinstance(host_memory, int) or host_memory < 0:
        raise BadRequest("host_memory_mb", "a non-negative integer (MiB)")
    return Node(
        name=body["name"],
        address=body["address"],
        fabric=body["fabric"],
        gpus=parsed,
        labels={str(k): str(v) for k, v in labels.items()},
        host_memory_mb=host_memory,
    )


def parse_gpu_health(gpus) -> dict[int, tuple[bool, str]]:
    if not isinstance(gpus, list):
        raise BadRequest("gpus", "expected a list of {index, healthy, reason}")
    health = {}
    for i, gpu in enumerate(gpus):
        if (
            not isinstance(gpu, dict)
            or not isinstance(gpu.get("index"), int)
            or not isinstance(gpu.get("healthy"), bool)
        ):
            raise BadRequest(f"gpus[{i}]", "needs index (integer) and healthy (boolean)")
        health[gpu["index"]] = (gpu["healthy"], str(gpu.get("reason") or ""))
    return health

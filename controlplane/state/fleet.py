"""The control plane's working state: its tables, their store, and the few operations on
them that the executor, the API's intents and agents' reports share.

Every change writes to the store, then to memory; what was acknowledged survives a restart.
Decisions are not made here (controlplane/tick/steps/ makes them, controlplane/tick/executor.py
carries them out): operators' calls are in state/intents.py, agents' in state/reports.py.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace

from controlplane.rules.adapters import Adapter, slot_id
from controlplane.rules.allocations import Allocations
from controlplane.rules.autoscale import Window
from controlplane.rules.cost import GpuMeter
from controlplane.rules.held import fix_started
from controlplane.rules.sleep import Memory, memory_of
from controlplane.rules.tenantshares import TenantLedger
from controlplane.rules.view import FleetView, TickSettings, desired, held_gpus, reserved_gpus
from controlplane.state.intents import Intents
from controlplane.state.orders import Orders
from controlplane.state.records import ModelRecords, Reservation
from controlplane.state.reports import REPLICA_REPORT_STATES, AgentReports, parse_node  # noqa: F401
from controlplane.state.store import Store
from controlplane.state.tenant_intents import TenantIntents
from controlplane.vocabulary.auth import Credentials
from controlplane.vocabulary.errors import BadRequest, Conflict, NotFound  # noqa: F401 (re-exported)
from controlplane.vocabulary.histogram import SWAP_BUCKETS, WAKE_BUCKETS, Histogram
from controlplane.vocabulary.idle import IdleState, IdleTracker, Router
from controlplane.vocabulary.model import ModelSpec, Node, Replica, ReplicaState
from controlplane.vocabulary.tenants import Tenant, TenantKey

EVENTS_PER_MODEL = 50


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
    auth: str = "none"  # what routers ask of a request: "tenants" (a tenant's key) or "none"
    # slot_id(replica, adapter) -> idle, for every adapter a replica holds
    adapter_idle: dict[str, tuple[float, IdleState]] = field(default_factory=dict)
    engine_load: dict[str, dict] = field(default_factory=dict)  # replica -> freshest reading
    # replica -> {"ordered": adapter loads the control plane ordered there, "resolved": loads
    # its engine made on a request}, since this leader took over
    adapter_ways: dict[str, dict] = field(default_factory=dict)


SWAPS_KEPT = 1000


class Fleet(Intents, TenantIntents, AgentReports):
    def __init__(
        self,
        store: Store,
        idle: IdleTracker | None = None,
        clock=time.monotonic,
        wall=time.time,
        ids=None,
    ) -> None:
        """`ids`: makes the suffix of each new replica's id (default: random); a simulation
        that must give the same figures for a seed hands a seeded one."""
        self.store = store
        self.new_suffix = ids or (lambda: uuid.uuid4().hex[:8])
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
        for replica in replicas.values():
            if not replica.memory_share:
                self._memory_of_older_version(replica)
        # model -> replicas kept now, when idleness brought it below its spec's `replicas`
        self.scaled: dict[str, int] = store.load_scaled()
        # What the leader acts on between ticks, kept as records (controlplane/state/records.py)
        # written once a tick: a new leader goes on from them.
        self.records = ModelRecords(store.load_records())
        kept = self.records.loaded()
        # model -> when requests last woke it: a wake counts as a use of the model, so what
        # woke is not stopped again before it had the time to serve them
        self.woken_at: dict[str, float] = kept["woken_at"]
        # Making room (controlplane/rules/room.py): model -> when requests began to wait for it, and
        # when a router last said so; what is reserved for whom; why a model gets no room.
        self.demand_since: dict[str, float] = kept["demand_since"]
        self.demanded_at: dict[str, float] = kept["demanded_at"]
        self.reservations: dict[str, Reservation] = kept["reservation"]
        self.room: dict[str, dict] = {}
        self.swapping: dict[str, tuple[str, float]] = {}  # replica -> (model, demand since)
        self.swaps: deque = deque(maxlen=SWAPS_KEPT)  # (at, model, demand-to-Ready seconds)
        self.swap_totals: dict[str, int] = kept["swaps"]
        self.swap_seconds = Histogram(SWAP_BUCKETS)
        # Sleeping engines (controlplane/rules/sleep.py): model -> sleeps and wakes; wake seconds.
        self.sleep_totals: dict[str, int] = kept["sleeps"]
        self.wake_totals: dict[str, int] = kept["wakes"]
        # LoRA adapters (controlplane/rules/adapters.py): the operator's objects, and loads and
        # unloads counted per adapter.
        self.adapters: dict[str, Adapter] = kept["adapter"]
        self.adapter_loads: dict[str, int] = kept["adapter_loads"]
        self.adapter_unloads: dict[str, int] = kept["adapter_unloads"]
        self.adapter_resolved: dict[str, int] = kept["adapter_resolved"]
        self.adapter_ways: dict[str, dict[str, int]] = {}  # replica -> way -> loads, in memory
        self.adapter_reasons: dict[str, str] = {}  # adapter -> why it is not loaded
        self.wake_seconds = Histogram(WAKE_BUCKETS)
        # Tenants (vocabulary/tenants.py): the operator's objects, their keys as digests, and
        # what routers report of them (controlplane/rules/tenantshares.py).
        self.tenants: dict[str, Tenant] = kept["tenant"]
        self.tenant_keys: dict[str, TenantKey] = kept["tenant_key"]
        self.ledger = TenantLedger()
        self.ledger.load(self.records.stored)
        self.meter = GpuMeter()
        self.meter.load(self.records.stored)
        self.allocations = Allocations()  # the meter's GPU time charged, kept per minute
        # "auth": "tenants" once any tenant was applied, kept when the last one goes, so that
        # deleting it never opens the routers; `auth_flag` (gpuctl server --auth) overrides.
        self.settings: dict[str, str] = kept["setting"]
        if self.tenants and "auth" not in self.settings:
            # A store written before the setting existed: its tenants close the routers as
            # an applied tenant does, for good, so that deleting the last one opens nothing.
            self.settings["auth"] = "tenants"
            self.flush_records()
        self.auth_flag: str | None = None
        # Autoscaling (controlplane/rules/autoscale.py): model -> its recommendation window, kept in
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
        self.orders = Orders()  # agents' watches of their assignments (state/orders.py)

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

    # adapters

    def load_adapter(self, replica: Replica, name: str) -> None:
        replica.want_adapters = [*replica.want_adapters, name]
        replica.adapter_failures = {k: v for k, v in replica.adapter_failures.items() if k != name}
        self.put_replica(replica)
        self.adapter_loads[name] = self.adapter_loads.get(name, 0) + 1
        self.count_adapter_way(replica.id, "ordered")
        self.changed = True
        self.event(name, f"loading on {replica.id}")

    def count_adapter_way(self, replica_id: str, way: str) -> None:
        ways = self.adapter_ways.setdefault(replica_id, {"ordered": 0, "resolved": 0})
        ways[way] += 1

    def unload_adapter(self, replica: Replica, name: str, why: str) -> None:
        """The safe stop of an adapter on one replica: its route there goes now; the engine
        unloads it once no router may route to it there (controlplane/tick/steps/withdrawals.py)."""
        replica.want_adapters = [a for a in replica.want_adapters if a != name]
        if name in replica.adapters and name not in replica.unloading:
            replica.unloading = {**replica.unloading, name: 0}  # stamped once published
        self.put_replica(replica)
        self.adapter_unloads[name] = self.adapter_unloads.get(name, 0) + 1
        self.changed = True
        self.event(name, f"unloading from {replica.id}: {why}; route withdrawn")

    # nodes

    # replicas

    def add_replica(self, model: str, placement) -> Replica:
        now = self.wall()
        replica = Replica(
            id=f"{model}-{self.new_suffix()}",
            model=model,
            placement=placement,
            created_at=now,
            updated_at=now,
        )
        self._fix_memory(replica)
        self.put_replica(replica)
        self.replicas[replica.id] = replica
        self._index(replica)
        self.changed = True
        self.event(model, f"replica {replica.id} placed on {', '.join(replica.nodes)}")
        return replica

    def _fix_memory(self, replica: Replica) -> None:
        """What its engine is started with, kept on it for its life (rules/held.py)."""
        spec = self.specs.get(replica.model) or self.leaving_specs.get(replica.model)
        if spec is None:
            return
        cards = [
            g.memory_mb
            for piece in replica.placement
            if piece.node in self.nodes
            for g in self.nodes[piece.node].gpus
            if g.index in piece.gpus
        ]
        fix_started(replica, spec, cards)

    def _memory_of_older_version(self, replica: Replica) -> None:
        """A replica stored before engines' shares were kept: the share an older version
        handed out for its spec (rounded to the nearest hundredth, so up to one more), and
        asleep as its state says."""
        self._fix_memory(replica)
        if replica.memory_share:
            replica.memory_share = min(1.0, round(replica.memory_share + 0.01, 2))
        replica.asleep_held = replica.state == ReplicaState.ASLEEP

    def _index(self, replica: Replica) -> None:
        for node in replica.nodes:
            self.on_node.setdefault(node, {})[replica.id] = None
        self.of_model.setdefault(replica.model, {})[replica.id] = None

    def replicas_of(self, model: str) -> list[Replica]:
        return [self.replicas[rid] for rid in self.of_model.get(model, ())]

    # acting on idle

    def desired(self, spec: ModelSpec) -> int:
        return desired(spec, self.scaled)

    def ready_count(self, model: str) -> int:
        return sum(1 for r in self.replicas_of(model) if r.state == ReplicaState.READY)

    def demand_answer(self, model: str) -> dict:
        """What a router that holds requests for `model` is told: `final` when no room can
        ever be made for it (the router answers its requests now); else they keep waiting."""
        reason = self.reasons.get(model, "")
        room = self.room.get(model)
        return {
            "model": model,
            "desired": self.desired(self.specs[model]),
            "ready": self.ready_count(model),
            "reason": reason,
            "final": bool(reason) and (room is None or room["final"]),
        }

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

    def reserved_gpus(self, but_for: str | None = None) -> dict[tuple[str, int], str]:
        return reserved_gpus(self.reservations, but_for)

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
        self.put_replica(replica)
        self.changed = True
        self.event(
            replica.model, f"replica {replica.id} {state}" + (f": {reason}" if reason else "")
        )

    def put_replica(self, replica: Replica) -> None:
        """Store `replica` as it now is; its nodes' agents hear of it (state/orders.py)."""
        self.store.put_replica(replica)
        self.orders.touched(replica.nodes)

    def remove_replica(self, replica_id: str) -> None:
        self.store.delete_replica(replica_id)
        replica = self.replicas.pop(replica_id, None)
        if replica is not None:
            self.orders.touched(replica.nodes)
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
        usage = {**self.ledger.take_dirty_rows(), **self.meter.take_dirty_rows()}
        if usage:
            with self.store.batch():
                for key, body in usage.items():
                    self.store.put_record(key, body)

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
                "adapter_resolved": self.adapter_resolved,
                "tenant": self.tenants,
                "tenant_key": self.tenant_keys,
                "setting": self.settings,
            },
        )

    def adapter_bases(self) -> dict[str, str]:
        """adapter -> the model whose engines serve it (GPU time is its base's)."""
        return {name: adapter.base for name, adapter in self.adapters.items()}

    @property
    def auth_mode(self) -> str:
        """What routers ask of a request: "tenants" (a key of a tenant) or "none"."""
        if self.auth_flag is not None:
            return self.auth_flag
        return self.settings.get("auth", "tenants" if self.tenants else "none")

    def held_gpus(self) -> set[tuple[str, int]]:
        """GPUs an awake engine holds."""
        return held_gpus(self.replicas.values())

    def sleepers(self) -> Memory:
        """What engines keep of each card's memory (awake and asleep) and sleepers of each
        node's host memory."""
        return memory_of(list(self.replicas.values()), self.specs, self.nodes)

    def view(self, route_version: int = 0, settings: TickSettings | None = None) -> FleetView:
        """What a tick's steps read (rules/view.py): the tables themselves, not copies."""
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
            engine_load=self.idle.engine_load(now),
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
            auth=self.auth_mode,
            adapter_ways={r: dict(ways) for r, ways in self.adapter_ways.items()},
        )

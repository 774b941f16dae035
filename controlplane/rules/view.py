"""What a tick's steps read: the fleet's tables, the routers' activity and the clock, as one
view that nothing changes while a step reads it.

The view holds the tables themselves, not copies (a tick at 16,000 nodes must not copy the
fleet for every step); steps only read it, and the executor changes the tables between steps.
A test builds a view from plain dicts, without a Fleet or a store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.rules.pacing import HeartbeatPacing
from controlplane.rules.placement import Placer
from controlplane.rules.room import RoomInputs
from controlplane.rules.sleep import Memory, holds_card, is_sleeper, memory_of
from controlplane.vocabulary.idle import IdleTracker
from controlplane.vocabulary.model import ModelSpec, ReplicaState

LIVE = {ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.UNHEALTHY}
# A model's replicas that count towards what it keeps: awake, or asleep and woken instead of
# placing another.
PRESENT = LIVE | {ReplicaState.SLEEPING, ReplicaState.ASLEEP, ReplicaState.WAKING}


@dataclass(frozen=True)
class TickSettings:
    node_timeout_s: float = 15.0
    failed_retention_s: float = 600.0
    min_residency_s: float = 120.0  # for specs that do not set min_residency
    # GPUs kept for a waiting model are given up when its victims have not stopped by then (a
    # silent router holds one): as a router's parked request gives up.
    room_timeout_s: float = 600.0
    heartbeat_s: float = 2.0  # a small fleet's heartbeat period; a large one's is longer
    max_heartbeats_per_s: float = 500.0
    # Hot cards hand on a hot model (rules/rebalance.py): off unless asked for, since on the
    # packing bench every move measured cost more than the sharing it ended.
    rebalance: bool = False

    @property
    def pacing(self) -> HeartbeatPacing:
        return HeartbeatPacing(self.heartbeat_s, self.max_heartbeats_per_s, self.node_timeout_s)


@dataclass
class FleetView:
    nodes: dict
    replicas: dict
    specs: dict[str, ModelSpec]
    idle: IdleTracker
    now: float  # wall clock
    clock: float = 0.0  # monotonic: heartbeats are stamped with it
    adapters: dict = field(default_factory=dict)
    scaled: dict[str, int] = field(default_factory=dict)
    reservations: dict = field(default_factory=dict)
    room: dict[str, dict] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    demand_since: dict[str, float] = field(default_factory=dict)
    demanded_at: dict[str, float] = field(default_factory=dict)
    woken_at: dict[str, float] = field(default_factory=dict)
    windows: dict = field(default_factory=dict)
    autoscale: dict[str, dict] = field(default_factory=dict)  # model -> the last decision
    adapter_reasons: dict[str, str] = field(default_factory=dict)
    on_node: dict | None = None  # node -> its replica ids (built when not given)
    of_model: dict | None = None  # model -> its replica ids
    route_version: int = 0  # the table routers hold now
    settings: TickSettings = field(default_factory=TickSettings)

    def __post_init__(self) -> None:
        if self.of_model is None or self.on_node is None:
            self.of_model, self.on_node = {}, {}
            for replica in self.replicas.values():
                self.of_model.setdefault(replica.model, {})[replica.id] = None
                for node in replica.nodes:
                    self.on_node.setdefault(node, {})[replica.id] = None

    # replicas and what a model keeps

    def replicas_of(self, model: str) -> list:
        return [self.replicas[rid] for rid in self.of_model.get(model, ()) if rid in self.replicas]

    def replicas_on(self, node: str) -> list:
        return [self.replicas[rid] for rid in self.on_node.get(node, ()) if rid in self.replicas]

    def desired(self, spec: ModelSpec) -> int:
        return desired(spec, self.scaled)

    def kept_for_others(self) -> set[str]:
        """Replicas a reservation counts on to free its GPUs."""
        return {v for r in self.reservations.values() for v in r.victims}

    # demand

    def demands(self) -> dict[str, float]:
        """What routers asked for that their reports may not count yet: a demand made within
        the lease, and after the report of some live router. Once every live router reported
        after it, their reports' `waiting` says who still waits: a demand that outlived its
        requests would take the cards back from the model that just made way (two models
        would swap back and forth until it expired)."""
        live = self.idle.live_routers(self.now)
        heard_from_all = min((r.received_at for r in live), default=float("-inf"))
        window = self.idle.live_window_s
        return {
            name: at
            for name, at in self.demanded_at.items()
            if self.now - at <= window and at >= heard_from_all
        }

    def wanted_adapters(self) -> dict[str, int]:
        """adapter -> requests waiting for it, as `wanted` counts them for models."""
        waiting = {m: n for m, n in self.idle.waiting(self.now).items() if m in self.adapters}
        for name in self.demands():
            if name in self.adapters:
                waiting[name] = max(waiting.get(name, 0), 1)
        return {m: n for m, n in waiting.items() if n > 0}

    def wanted(self) -> dict[str, int]:
        """model -> requests waiting for it: what live routers report, and a model a router
        asked for though no report counts it yet (at least 1; `demands`)."""
        waiting = dict(self.idle.waiting(self.now))
        for model in self.demands():
            waiting[model] = max(waiting.get(model, 0), 1)
        wanted = {m: n for m, n in waiting.items() if n > 0 and m in self.specs}
        for name, n in self.wanted_adapters().items():
            base = self.adapters[name].base
            if not any(r.state == ReplicaState.READY for r in self.replicas_of(base)):
                wanted[base] = wanted.get(base, 0) + n  # its base wakes, as for itself
        return wanted

    # cards

    def reserved_gpus(self, but_for: str | None = None) -> dict[tuple[str, int], str]:
        return reserved_gpus(self.reservations, but_for)

    def sleepers(self) -> Memory:
        """What engines keep of each card's memory (awake and asleep) and each node's host
        memory (sleepers at level 1)."""
        return memory_of(list(self.replicas.values()), self.specs, self.nodes)

    def replica_rates(self) -> dict[str, float]:
        """replica -> requests a second routers sent it, over a recent window."""
        return self.idle.rates.rates(self.idle.clock())

    def model_rates(self) -> dict[str, float]:
        """model -> requests a second to its replicas (asleep ones too: a sleeper's rate
        fades over the window after it fell asleep)."""
        rates: dict[str, float] = {}
        for rid, rate in self.replica_rates().items():
            replica = self.replicas.get(rid)
            if replica is not None:
                rates[replica.model] = rates.get(replica.model, 0.0) + rate
        return rates

    def card_load(self) -> dict[tuple[str, int], float]:
        """Requests a second, over a recent window, to what is awake on each card."""
        load: dict[tuple[str, int], float] = {}
        for rid, rate in self.replica_rates().items():
            replica = self.replicas.get(rid)
            if replica is None or not rate or not holds_card(replica):
                continue
            for piece in replica.placement:
                for index in piece.gpus:
                    load[(piece.node, index)] = load.get((piece.node, index), 0.0) + rate
        return load

    def placer(self, but_for: str | None = None) -> Placer:
        """Placement over the fleet as it stands: what engines hold of each card's memory
        is taken, and cards kept for a waiting model (but `but_for`) are taken whole; the
        popular apart from each other (rules/placement.py)."""
        memory = self.sleepers()
        return Placer(
            list(self.nodes.values()),
            set(self.reserved_gpus(but_for)),
            memory.used(),
            self.card_load(),
            self.models_on_cards(),
            self.model_rates(),
            {gpu: mb for gpu, mb in memory.awake.items() if mb > 0},
        )

    def models_on_cards(self) -> dict[tuple[str, int], set[str]]:
        """The models each card holds, awake or asleep."""
        on: dict[tuple[str, int], set[str]] = {}
        for replica in self.replicas.values():
            if holds_card(replica) or is_sleeper(replica):
                for piece in replica.placement:
                    for index in piece.gpus:
                        on.setdefault((piece.node, index), set()).add(replica.model)
        return on

    def room_inputs(self) -> RoomInputs:
        """What the pure steps of making room, sleeping and waking read."""
        ids = list(self.replicas)
        return RoomInputs(
            nodes=list(self.nodes.values()),
            replicas=list(self.replicas.values()),
            specs=dict(self.specs),
            desired={name: self.desired(s) for name, s in self.specs.items()},
            idle=self.idle.idle_map(ids, self.now),
            in_flight=self.idle.in_flight(self.now),
            silent_holders=self.idle.silent_holders(ids, self.now),
            reserved=self.reserved_gpus(),
            now=self.now,
            default_residency_s=self.settings.min_residency_s,
            rates=self.demand_rates(),
        )

    def demand_rates(self) -> dict[str, float]:
        """model -> its rate, plus its requests waiting now spread over the rate's window: a
        model asked for while nothing of it is awake is as popular as its queue."""
        rates = self.model_rates()
        for model, waiting in self.wanted().items():
            rates[model] = rates.get(model, 0.0) + waiting / self.idle.rates.window_s
        return rates

    # the safe stop

    def acked_from(self, stamp: int) -> int:
        """The route version a router must hold for a withdrawal stamped `stamp`: 0, not yet
        published, is the next table's. Never above the table now published, which is without
        the route too: a stamp made by a leader whose clock ran ahead must not wait for ever."""
        return min(stamp, self.route_version) if stamp else self.route_version + 1

    def still_held(self, endpoint: str, stamp: int) -> str:
        """Which router may still route to `endpoint` or has a request on it ("" for none)."""
        return self.idle.still_held(endpoint, self.acked_from(stamp))


def desired(spec: ModelSpec, scaled: dict[str, int]) -> int:
    """Replicas to keep now: the spec's, or fewer while idleness has scaled it down; an
    autoscaled model's, anywhere within its bounds."""
    kept = scaled.get(spec.name, spec.replicas)
    if spec.autoscaled:
        return min(kept, spec.ceiling)
    return min(spec.replicas, kept)


def held_gpus(replicas) -> set[tuple[str, int]]:
    return {
        (piece.node, index)
        for r in replicas
        if holds_card(r)
        for piece in r.placement
        for index in piece.gpus
    }


def reserved_gpus(reservations: dict, but_for: str | None = None) -> dict[tuple[str, int], str]:
    """GPU -> the model it is kept for (every reservation except `but_for`'s)."""
    return {gpu: r.model for r in reservations.values() if r.model != but_for for gpu in r.gpus()}


def had_route(replica) -> bool:
    """Whether a router may hold a route to `replica` or a request on it: it was Ready once
    (an Unhealthy one may still carry streams), or its route is being withdrawn. Pending and
    Starting replicas never had one; a sleeper's was withdrawn and acknowledged before its
    engine slept, and a waking one gets its route only once Ready."""
    if replica.state in (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.ASLEEP,
                         ReplicaState.WAKING, ReplicaState.STOPPING):  # fmt: skip
        return False
    if replica.state == ReplicaState.SLEEPING:
        return not replica.sleep  # told to sleep only once no router held it
    if replica.state == ReplicaState.RETIRING:
        return True
    return replica.ready_at > 0

"""The whole tick over random histories: fleets, specs, routers that stream, fall silent and
come back, operators' calls, and faults (a node lost and back, a GPU fault, an engine dead, a
leader change). After every tick the rules hold; the oracle here states them from what the
simulated agents and routers know, and never asks the steps.

- A replica that had a route stops only once every router that has not said goodbye last
  reported a table without it and no request on it (a silent router's last report counts).
- A stop, sleep or scale-in the fleet decides by itself (idle, making room, load) takes only
  a Ready replica that some live router watched, with no request on any router and no silent
  router holding it; and its model keeps at least min_replicas Ready replicas.
- No model is kept below min_replicas by the fleet's own decisions.
- The summary counts what the tables show.
"""

import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.state.fleet import Fleet
from controlplane.state.store import SqliteStore
from controlplane.tick.reconciler import Reconciler
from controlplane.views.summary import model_rows, replica_rows, summary
from controlplane.vocabulary.idle import IdleTracker
from controlplane.vocabulary.model import ReplicaState, Schedulable
from tests.controlplane.conftest import Clock, make_node, spec

LEASE_S = 10.0
NODES = ("n1", "n2", "n3")
MODELS = ("a", "b", "c")
ROUTED = {ReplicaState.READY, ReplicaState.UNHEALTHY, ReplicaState.RETIRING}
VOLUNTARY = ("to make room for", "put to sleep", "scaled in", "idle ")


class SimRouter:
    """A router as the control plane sees it: the table it fetched, what it reported."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.silent = False
        self.version = 0
        self.table: dict[str, list[str]] = {}
        self.since: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.in_flight: Counter = Counter()
        self.reported_at = float("-inf")
        self.reported_table: set[str] = set()
        self.reported_in_flight: Counter = Counter()
        self.waiting: dict[str, int] = {}
        self.requests: Counter = Counter()  # replica -> requests sent since watched

    def endpoints(self) -> set[str]:
        return {e for eps in self.table.values() for e in eps}

    def fetch(self, routes) -> None:
        self.version = routes.version
        self.table = {m: [e["id"] for e in eps] for m, eps in routes.routes.items()}

    def report(self, fleet, now: float) -> None:
        ids = self.endpoints()
        self.since = {i: self.since.get(i, now) for i in ids}
        fleet.idle.report(
            {
                "router": self.name,
                "incarnation": "i1",
                "uptime_s": 10_000,
                "route_version": self.version,
                # a request in flight is a use now, as gpurouter's snapshot says
                "used": {
                    i: 0.0 if self.in_flight.get(i) else now - t
                    for i, t in self.used.items()
                    if i in ids
                },
                "watched": {i: now - self.since[i] for i in ids},
                "in_flight": {i: n for i, n in self.in_flight.items() if n},
                "waiting": dict(self.waiting),
                "requests": {i: n for i, n in self.requests.items() if i in ids},
            }
        )
        self.reported_at = now
        self.reported_table = ids
        self.reported_in_flight = Counter({i: n for i, n in self.in_flight.items() if n})


class World:
    def __init__(self, directory: Path, nodes=NODES, gpus: int = 2, rebalance=True) -> None:
        self.rebalance = rebalance  # on here, so that random histories move models too
        self.path = directory / "state.sqlite"
        self.clock = Clock()
        self.stores = []
        self.routers = [SimRouter("r1"), SimRouter("r2")]
        self.partitioned: set[str] = set()
        self.dead: set[str] = set()  # replicas whose engine died
        self.running: dict[str, dict[str, bool]] = {}  # node -> replica -> asleep
        self.open()
        for name in nodes:
            self.fleet.register(make_node(name, gpus=gpus))

    def open(self) -> None:
        """A control plane (again, after a leader change) on the same store."""
        store = SqliteStore(self.path)
        self.stores.append(store)
        idle = IdleTracker(live_window_s=LEASE_S, clock=self.clock)
        self.fleet = Fleet(store, idle, clock=self.clock, wall=self.clock)
        self.reconciler = Reconciler(
            self.fleet, node_timeout_s=15, min_residency_s=5, rebalance=self.rebalance
        )

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def heartbeats(self) -> None:
        """Each reachable agent reports what it runs, then runs what it is assigned (what a
        partition kept running is reported again when it heals)."""
        for node in NODES:
            if node in self.partitioned or node not in self.fleet.nodes:
                continue
            reports = {}
            for i, (replica, asleep) in enumerate(sorted(self.running.get(node, {}).items())):
                if replica in self.dead:
                    reports[replica] = {"state": "Failed", "exit_code": -9}
                elif asleep:
                    reports[replica] = {"state": "Asleep"}
                else:
                    reports[replica] = {"state": "Ready", "url": f"http://127.0.0.1:{9000 + i}"}
            assigned = self.fleet.heartbeat(node, {"replicas": reports})
            self.running[node] = {a["replica"]: bool(a["sleep"]) for a in assigned}

    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.heartbeats()
        for router in self.routers:
            if not router.silent:
                router.fetch(self.reconciler.routes)
                router.report(self.fleet, self.clock())
        before = {r.id: (r.state, r.reason) for r in self.fleet.replicas.values()}
        routed_once = {r.id for r in self.fleet.replicas.values() if r.ready_at > 0}
        ready_before = {r.id for r in self.fleet.replicas.values() if r.state == ReplicaState.READY}
        self.reconciler.tick()
        self.check(before, routed_once, ready_before)

    # the rules

    def holders(self, replica: str) -> list[str]:
        """Routers that may still route to `replica` or carry a request on it, as their last
        reports say."""
        return [
            r.name
            for r in self.routers
            if replica in r.reported_table or r.reported_in_flight.get(replica)
        ]

    def live(self) -> list[SimRouter]:
        now = self.clock()
        return [r for r in self.routers if now - r.reported_at <= LEASE_S]

    def check(self, before: dict, routed_once: set, ready_before: set) -> None:
        fleet = self.fleet
        after = {r.id: r for r in fleet.replicas.values()}
        for rid, (state, _) in before.items():
            now_state = after[rid].state if rid in after else None
            stopped = now_state in (ReplicaState.STOPPING, None) and state != now_state
            lost = rid in after and after[rid].state == ReplicaState.FAILED
            if stopped and rid in routed_once and state in ROUTED and not lost:
                if now_state is None and state != ReplicaState.RETIRING:
                    continue  # forgotten with a lost or deleted node: nothing ran it
                assert not self.holders(rid), (rid, state, after.get(rid), self.holders(rid))
        for rid, replica in after.items():
            was = before.get(rid, (None, ""))[0]
            decided = replica.state in (ReplicaState.RETIRING, ReplicaState.SLEEPING)
            if not (decided and was == ReplicaState.READY and rid in ready_before):
                continue
            if not any(word in replica.reason for word in VOLUNTARY):
                continue
            assert not any(r.reported_in_flight.get(rid) for r in self.routers), replica.reason
            assert any(rid in r.reported_table for r in self.live()), ("unknown use", rid)
            silent = [r for r in self.routers if r not in self.live()]
            assert not any(rid in r.reported_table for r in silent), ("silent holder", rid)
            spec_ = fleet.specs.get(replica.model)
            if spec_ is not None:
                ready = sum(
                    1 for r in fleet.replicas_of(replica.model) if r.state == ReplicaState.READY
                )
                assert ready >= spec_.floor, (replica.model, ready, spec_.floor)
        for model in fleet.specs.values():
            assert fleet.desired(model) >= min(model.floor, model.replicas), model.name
        snap = fleet.snapshot(self.reconciler.routes.version)
        told = summary(snap)
        assert told["replicas"]["by_state"] == dict(
            sorted(Counter(row["state"] for row in replica_rows(snap)).items())
        )
        assert told["replicas"]["total"] == len(fleet.replicas)
        assert told["models"]["total"] == len(model_rows(snap)) == len(fleet.specs)


def model_spec(draw, name):
    sleeps = draw(st.booleans())
    fields = {
        "replicas": draw(st.integers(0, 2)),
        "gpus_per_replica": draw(st.integers(1, 2)),
        "min_replicas": draw(st.sampled_from([0, 0, 1])),
        "priority": draw(st.integers(0, 1)),
        "scale_to_zero_after": draw(st.sampled_from(["20s", "1m"])),
        "min_residency": "5s",
    }
    fields["min_replicas"] = min(fields["min_replicas"], fields["replicas"])
    if sleeps:
        fields.update(engine="vllm", sleep={"level": 1, "after": "15s"})
    return spec(name=name, **fields)


operations = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from([1.0, 3.0, 8.0, 20.0])),
    st.tuples(st.just("scale"), st.sampled_from(MODELS), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.sampled_from(MODELS)),
    st.tuples(st.just("drain"), st.sampled_from(NODES)),
    st.tuples(st.just("partition"), st.sampled_from(NODES)),
    st.tuples(st.just("heal"), st.sampled_from(NODES)),
    st.tuples(st.just("gpu_fault"), st.sampled_from(NODES), st.integers(0, 1)),
    st.tuples(st.just("engine_dead"), st.integers(0, 5)),
    st.tuples(st.just("silent"), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("stream"), st.integers(0, 1), st.sampled_from(MODELS)),
    st.tuples(st.just("stream_ends"), st.integers(0, 1)),
    st.tuples(st.just("requests"), st.integers(0, 1), st.sampled_from(MODELS),
              st.sampled_from([1, 20, 200])),  # fmt: skip
    st.tuples(st.just("wait"), st.integers(0, 1), st.sampled_from(MODELS), st.integers(0, 2)),
    st.tuples(st.just("leader_change")),
)


@st.composite
def histories(draw):
    specs = [model_spec(draw, name) for name in MODELS]
    ops = draw(st.lists(operations, min_size=5, max_size=30))
    return specs, ops


def run(world: World, op: tuple) -> None:
    fleet, kind = world.fleet, op[0]
    if kind == "tick":
        world.tick(op[1])
    elif kind == "scale" and op[1] in fleet.specs:
        model = fleet.specs[op[1]]
        if not model.autoscaled and op[2] >= model.floor:
            fleet.scale(op[1], op[2])
    elif kind == "delete" and op[1] in fleet.specs:
        fleet.delete(op[1])
    elif kind == "drain" and op[1] in fleet.nodes:
        fleet.set_schedulable(op[1], Schedulable.DRAINING)
    elif kind == "partition":
        world.partitioned.add(op[1])
    elif kind == "heal":
        world.partitioned.discard(op[1])
    elif kind == "gpu_fault" and op[1] in fleet.nodes and op[1] not in world.partitioned:
        fleet.heartbeat(op[1], {"gpus": [{"index": op[2], "healthy": False, "reason": "XID 79"}]})
    elif kind == "engine_dead" and fleet.replicas:
        ids = sorted(fleet.replicas)
        world.dead.add(ids[op[1] % len(ids)])
    elif kind == "silent":
        world.routers[op[1]].silent = op[2]
    elif kind == "stream":
        router = world.routers[op[1]]
        endpoints = router.table.get(op[2], [])
        if endpoints and not router.silent:
            target = endpoints[0]
            router.in_flight[target] += 1
            router.requests[target] += 1
            router.used[target] = world.clock()
    elif kind == "requests":
        # Requests that came and went since the last report: popularity, nothing in flight.
        router = world.routers[op[1]]
        for target in router.table.get(op[2], [])[:1]:
            router.requests[target] += op[3]
            router.used[target] = world.clock()
    elif kind == "stream_ends":
        router = world.routers[op[1]]
        busy = sorted(i for i, n in router.in_flight.items() if n)
        if busy:
            router.in_flight[busy[0]] -= 1
            router.used[busy[0]] = world.clock()
    elif kind == "wait":
        world.routers[op[1]].waiting[op[2]] = op[3]
    elif kind == "leader_change":
        world.open()


def play(make_world, specs: list[dict], ops: list[tuple], step) -> None:
    """A world from `make_world(directory)`, the specs applied, each op through `step(world,
    op)`, then time for the fleet to settle; every tick checks the rules on the way."""
    with tempfile.TemporaryDirectory() as directory:
        world = make_world(Path(directory))
        try:
            for body in specs:
                world.fleet.apply(body)
            world.tick(1.0)
            for op in ops:
                step(world, op)
            for _ in range(3):
                world.tick(3.0)
        finally:
            world.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_every_tick_keeps_the_rules(history):
    specs, ops = history
    play(World, specs, ops, run)

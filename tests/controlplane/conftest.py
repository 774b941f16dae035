import pytest

from controlplane.rules.held import fix_started
from controlplane.state.fleet import Fleet
from controlplane.state.store import SqliteStore
from controlplane.tick.reconciler import Reconciler
from controlplane.vocabulary.idle import IdleTracker
from controlplane.vocabulary.model import GPU, Node, ReplicaState


class Clock:
    """Injected time: tests move it forward instead of sleeping."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_node(name, fabric="ib-a", gpus=8, gpu_class="H100-80GB", address=None):
    return {
        "name": name,
        "address": address or "127.0.0.1",
        "fabric": fabric,
        "gpus": [
            {"index": i, "uuid": f"GPU-{name}-{i}", "gpu_class": gpu_class, "memory_mb": 81559}
            for i in range(gpus)
        ],
    }


def node_obj(name, fabric="ib-a", gpus=8, gpu_class="H100-80GB", **state):
    node = Node(
        name=name,
        address="127.0.0.1",
        fabric=fabric,
        gpus=[GPU(i, f"GPU-{name}-{i}", gpu_class) for i in range(gpus)],
    )
    for key, value in state.items():
        setattr(node, key, value)
    return node


def spec(name="llama", gpu_class="H100-80GB", **kw):
    return {
        "name": name,
        "gpu_class": gpu_class,
        "command": ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}"],
        **kw,
    }


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def make_fleet(tmp_path, clock):
    """A Fleet on a SQLite file, with injected clocks; call again to 'restart' on the same file."""
    path = tmp_path / "state.sqlite"
    opened = []

    def factory():
        store = SqliteStore(path)
        opened.append(store)
        fleet = Fleet(store, IdleTracker(live_window_s=10, clock=clock), clock=clock, wall=clock)
        return fleet, Reconciler(fleet, node_timeout_s=15)

    yield factory
    for store in opened:
        store.close()


class ReportingRouter:
    """One router's activity reports, as gpurouter sends them: the replicas (and adapter
    slots) of the table it holds, watched since they appeared in it, with the uses, requests
    in flight and requests waiting a test gives."""

    def __init__(self, fleet, reconciler, name="edge"):
        self.fleet, self.reconciler, self.name = fleet, reconciler, name
        self.since = {}  # endpoint -> when this router's table first had it

    def report(self, used=None, waiting=None, in_flight=None):
        now = self.fleet.wall()
        ids = [e["id"] for eps in self.reconciler.routes.routes.values() for e in eps]
        self.since = {i: self.since.get(i, now) for i in ids}
        self.fleet.idle.report(
            {
                "router": self.name,
                "incarnation": "i1",
                "uptime_s": 1000,
                "route_version": self.reconciler.routes.version,
                "used": used or {},
                "watched": {i: now - self.since[i] for i in ids},
                "in_flight": in_flight or {},
                "waiting": waiting or {},
            }
        )


def as_placed(replicas, specs, nodes):
    """`replicas` as the fleet keeps them once placed (controlplane/rules/held.py): the share
    each engine was started with, from its spec and cards, and a sleeper's reserve once its
    agent said it sleeps. `specs` and `nodes`: by name. Returns the list."""
    specs = specs if isinstance(specs, dict) else {s.name: s for s in specs}
    nodes = nodes if isinstance(nodes, dict) else {n.name: n for n in nodes}
    for replica in replicas:
        spec_ = specs.get(replica.model)
        if spec_ is None:
            continue
        cards = [
            g.memory_mb
            for piece in replica.placement
            if piece.node in nodes
            for g in nodes[piece.node].gpus
            if g.index in piece.gpus
        ]
        fix_started(replica, spec_, cards)
        replica.asleep_held = replica.state == ReplicaState.ASLEEP
    return list(replicas)

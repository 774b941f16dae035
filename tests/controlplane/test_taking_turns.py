"""Two models that take turns on one node's cards, tick by tick: a request for either is
served once the other makes way, and never answered at once as if no room could be made.

The agent, the router and the engines are simulated here as the control plane sees them,
with the defaults' pacing: a tick a second, a heartbeat and an activity report every two
seconds, the route table fetched as soon as a tick publishes it, engines that start in a
few seconds."""

from collections import Counter

import pytest

from controlplane.state.fleet import Fleet
from controlplane.state.store import SqliteStore
from controlplane.tick.reconciler import Reconciler
from controlplane.vocabulary.idle import IdleTracker
from tests.controlplane.conftest import Clock, make_node, spec

STEP_S = 0.25
TICK_S, HEARTBEAT_S, REPORT_S = 1.0, 2.0, 2.0
COLD_START_S = 3.0
SERVE_S = 1.0  # how long one request streams
PARK_S = 60.0  # the router's park timeout


class Agent:
    """Runs what it is assigned; an engine is Ready COLD_START_S after it started."""

    def __init__(self, fleet: Fleet, clock: Clock) -> None:
        self.fleet, self.clock = fleet, clock
        self.started: dict[str, float] = {}

    def heartbeat(self) -> None:
        now = self.clock()
        reports = {}
        for i, (replica, since) in enumerate(sorted(self.started.items())):
            ready = now - since >= COLD_START_S
            reports[replica] = (
                {"state": "Ready", "url": f"http://127.0.0.1:{9000 + i}"}
                if ready
                else {"state": "Starting"}
            )
        assigned = {a["replica"] for a in self.fleet.heartbeat("n1", {"replicas": reports})}
        self.started = {r: self.started.get(r, now) for r in assigned}


class Router:
    """Sends a request to a replica of its model in its table, else parks it and asks the
    control plane (the API's answer: fleet.demand, the next tick, demand_answer)."""

    def __init__(self, fleet: Fleet, reconciler: Reconciler, clock: Clock) -> None:
        self.fleet, self.reconciler, self.clock = fleet, reconciler, clock
        self.version = 0
        self.table: dict[str, list[str]] = {}
        self.since: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.streams: list[tuple[str, float]] = []  # (replica, ends at)
        self.parked: list[tuple[str, float]] = []  # (model, parked at)
        self.outcomes: Counter = Counter()
        self.refusals: list[str] = []

    def fetch(self) -> None:
        routes = self.reconciler.routes
        self.version = routes.version
        self.table = {m: [e["id"] for e in eps] for m, eps in routes.routes.items()}

    def in_flight(self) -> Counter:
        return Counter(replica for replica, _ in self.streams)

    def report(self) -> None:
        now = self.clock()
        ids = {e for eps in self.table.values() for e in eps}
        self.since = {i: self.since.get(i, now) for i in ids}
        busy = self.in_flight()
        self.fleet.idle.report(
            {
                "router": "r1",
                "incarnation": "i1",
                "uptime_s": 10_000,
                "route_version": self.version,
                "used": {
                    i: 0.0 if busy.get(i) else now - t for i, t in self.used.items() if i in ids
                },
                "watched": {i: now - self.since[i] for i in ids},
                "in_flight": dict(busy),
                "waiting": dict(Counter(m for m, _ in self.parked)),
            }
        )

    def send(self, model: str) -> bool:
        replicas = self.table.get(model)
        if not replicas:
            return False
        replica = min(replicas, key=lambda r: self.in_flight().get(r, 0))
        self.streams.append((replica, self.clock() + SERVE_S))
        self.used[replica] = self.clock()
        self.outcomes["served"] += 1
        return True

    def request(self, model: str) -> None:
        if self.send(model):
            return
        self.parked.append((model, self.clock()))
        waiting = sum(1 for m, _ in self.parked if m == model)
        self.fleet.demand(model, waiting)
        self.reconciler.tick()  # the API waits for the next tick before it answers
        self.fetch()
        answer = self.fleet.demand_answer(model)
        if not answer["ready"] and answer["final"]:
            self.refusals.append(f"{model}: {answer['reason']}")
            self.outcomes["refused at once"] += 1
            self.parked = [(m, t) for m, t in self.parked if m != model]

    def step(self) -> None:
        now = self.clock()
        self.streams = [(r, end) for r, end in self.streams if end > now]
        still = []
        for model, at in self.parked:
            if self.send(model):
                continue
            if now - at >= PARK_S:
                self.outcomes["park timeout"] += 1
            else:
                still.append((model, at))
        self.parked = still


def run(tmp_path, gap_s: float, rounds: int, residency: str = "2s") -> Router:
    clock = Clock()
    store = SqliteStore(tmp_path / "state.sqlite")
    fleet = Fleet(store, IdleTracker(live_window_s=10.0, clock=clock), clock=clock, wall=clock)
    reconciler = Reconciler(fleet, node_timeout_s=15, min_residency_s=120)
    fleet.register(make_node("n1", gpus=2))
    for name in ("a", "b"):
        fleet.apply(
            spec(
                name=name, gpus_per_replica=2, replicas=1, min_replicas=0, min_residency=residency
            )  # fmt: skip
        )
    agent, router = Agent(fleet, clock), Router(fleet, reconciler, clock)
    start = clock()
    asks = [(start + 5.0 + i * gap_s, "ab"[i % 2]) for i in range(rounds)]
    next_tick = next_beat = next_report = start
    try:
        while asks or router.parked or router.streams:
            now = clock()
            assert now - start < rounds * gap_s + 2 * PARK_S, "the run ends"
            while asks and asks[0][0] <= now:
                router.request(asks.pop(0)[1])
            router.step()
            if now >= next_beat:
                agent.heartbeat()
                next_beat = now + HEARTBEAT_S
            if now >= next_report:
                router.report()
                next_report = now + REPORT_S
            if now >= next_tick:
                reconciler.tick()
                router.fetch()
                next_tick = now + TICK_S
            clock.advance(STEP_S)
    finally:
        store.close()
    return router


@pytest.mark.parametrize("gap_s", [3.0, 5.0, 8.0])
def test_two_models_taking_turns_are_never_refused_at_once(tmp_path, gap_s):
    router = run(tmp_path, gap_s, rounds=24)
    assert router.refusals == [], router.refusals
    assert router.outcomes == {"served": 24}, router.outcomes


def test_a_model_that_can_never_start_is_refused_with_what_blocks_it_for_good(tmp_path):
    clock = Clock()
    store = SqliteStore(tmp_path / "state.sqlite")
    fleet = Fleet(store, IdleTracker(live_window_s=10.0, clock=clock), clock=clock, wall=clock)
    reconciler = Reconciler(fleet, node_timeout_s=15, min_residency_s=0)
    try:
        fleet.register(make_node("n1", gpus=2))
        fleet.apply(spec(name="a", gpus_per_replica=2, replicas=1, priority=1))
        fleet.apply(spec(name="b", gpus_per_replica=2, replicas=1, min_replicas=0))
        agent, router = Agent(fleet, clock), Router(fleet, reconciler, clock)
        for _ in range(8):
            reconciler.tick()
            agent.heartbeat()
            router.fetch()
            router.report()
            clock.advance(1.0)
        router.request("b")
        (refusal,) = router.refusals
        assert "no room can be made: " in refusal and "priority 1 above b's 0" in refusal
        assert "kept for" not in refusal and "Starting" not in refusal, refusal
    finally:
        store.close()

"""More models than cards: one trace, four policies, the control plane's own decisions.

    python -m bench.multiplex [--models 24] [--cards 8] [--minutes 30] [--cv 1 2 4] ...

A trace of requests (Zipf popularity over the models, gamma inter-arrival times with a given
coefficient of variation: bursts) is played against each policy on the same fleet:

- pinned: one replica per model, never stopped; what does not fit is never served
- cold: models scale to zero when idle and make room by stopping idle ones (a cold start)
- sleep: the same, with engines that sleep when idle and wake on a request
- dedicated: every model on cards of its own (three times the cards): the bound

The control plane is the real one (Fleet, Reconciler and their pure steps, on SQLite), run on a
virtual clock; the agent and the router are modelled in this file: engines take `--cold-start`
to load, `--wake` to wake and `--sleep-time` to fall asleep, and the router parks requests for a
model with no route and sends them the moment one arrives, as gpurouter does. A virtual clock
makes a 30-minute trace take seconds, and the same trace give the same figures on a busy
machine. A request's time to first token is its wait for a route plus the engine's own TTFT.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import tempfile
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.fleet import Fleet
from controlplane.idle import IdleTracker
from controlplane.reconciler import Reconciler
from controlplane.store import SqliteStore

CARD_MB = 81559  # H100-80GB, as NVML counts it
HOST_MB = 2 * 1024 * 1024  # a DGX-class node's 2 TiB
TICK_S = 0.5  # control-plane ticks and agents' heartbeats
REPORT_S = 1.0  # routers' activity reports
POLICIES = ("pinned", "cold", "sleep", "dedicated")


@dataclass(frozen=True)
class Settings:
    models: int = 24
    cards: int = 8
    minutes: float = 30.0
    rate: float = 0.5  # requests a second, all models together
    cv: float = 2.0  # of the inter-arrival times: 1 is Poisson, more is burstier
    zipf: float = 1.1
    cold_start_s: float = 60.0  # vLLM's, for a small model (vllm #20264)
    wake_s: float = 2.0  # level-1 wake: 18-200x faster than a reload by vLLM's account
    sleep_s: float = 1.0
    engine_ttft_s: float = 0.2
    service_s: float = 3.0  # a request's whole answer
    slo_s: float = 5.0  # time to first token
    park_timeout_s: float = 120.0
    sleep_after_s: float = 30.0
    scale_to_zero_after_s: float = 600.0
    residency_s: float = 30.0  # min_residency: half a cold start
    sleep_residency_s: float = 5.0  # a few wakes: ping-pong costs little when a swap is a wake
    warmup_minutes: float = 15.0  # every model asked for now and then, not measured
    seed: int = 7


@dataclass(order=True)
class Request:
    at: float
    model: str = field(compare=False)
    started: float = field(default=-1.0, compare=False)
    parked: bool = field(default=False, compare=False)
    refused: bool = field(default=False, compare=False)


def trace(s: Settings) -> list[Request]:
    """Arrivals over `s.minutes`: gamma inter-arrival times of mean 1/rate and CV `s.cv`, each
    request for a model drawn by Zipf popularity."""
    rng = random.Random(s.seed)
    names = model_names(s.models)
    weights = [1 / (rank + 1) ** s.zipf for rank in range(s.models)]
    shape = 1 / (s.cv * s.cv)
    scale = (1 / s.rate) / shape
    out, at = [], 0.0
    while True:
        at += rng.gammavariate(shape, scale)
        if at >= s.minutes * 60:
            return out
        out.append(Request(at, rng.choices(names, weights)[0]))


def model_names(count: int) -> list[str]:
    width = len(str(count - 1))
    return [f"m{i:0{width}d}" for i in range(count)]


def spec_for(name: str, policy: str, s: Settings) -> dict:
    body = {
        "name": name,
        "gpu_class": "H100-80GB",
        "command": ["vllm", "serve", "{model}", "--port", "{port}"],
        "engine": "vllm",
        "replicas": 1,
        "min_residency": s.residency_s,
    }
    if policy in ("cold", "sleep"):
        body |= {"min_replicas": 0, "scale_to_zero_after": s.scale_to_zero_after_s}
    if policy == "sleep":
        body["sleep"] = {"level": 1, "after": s.sleep_after_s, "wake_timeout": "10m"}
        body["min_residency"] = s.sleep_residency_s
    return body


@dataclass
class Engine:
    state: str  # starting, ready, sleeping, asleep, waking
    until: float
    gpus: int
    adapters: dict[str, float] = field(default_factory=dict)  # adapter -> loaded from then


REPORTED = {
    "starting": "Starting",
    "ready": "Ready",
    "sleeping": "Ready",
    "asleep": "Asleep",
    "waking": "Waking",
}


class Agent:
    """One node's agent, its engines modelled: they load, sleep and wake in set times."""

    def __init__(self, fleet: Fleet, node: str, s: Settings, adapter_load_s: float = 0.5) -> None:
        self.fleet, self.node, self.s = fleet, node, s
        self.adapter_load_s = adapter_load_s
        self.engines: dict[str, Engine] = {}
        self.cold_starts = self.wakes = 0
        self.gpu_seconds_awake = 0.0

    def beat(self, now: float) -> None:
        wanted = {a["replica"]: a for a in self.fleet.assignments(self.node)}
        for rid in list(self.engines):
            if rid not in wanted:
                del self.engines[rid]
        for rid, a in wanted.items():
            engine = self.engines.get(rid)
            if engine is None:
                engine = self.engines[rid] = Engine(
                    "starting", now + self.s.cold_start_s, len(a["gpus"])
                )
                self.cold_starts += 1
            elif a["sleep"] and engine.state == "ready":
                engine.state, engine.until = "sleeping", now + self.s.sleep_s
            elif not a["sleep"] and engine.state == "asleep":
                engine.state, engine.until = "waking", now + self.s.wake_s
                self.wakes += 1
            if engine.until <= now:
                engine.state = {"starting": "ready", "sleeping": "asleep", "waking": "ready"}.get(
                    engine.state, engine.state
                )
            if engine.state == "ready":
                wanted = [x["name"] for x in a["adapters"]]
                engine.adapters = {
                    name: engine.adapters.get(name, now + self.adapter_load_s) for name in wanted
                }
        reports = {
            rid: {
                "state": REPORTED[e.state],
                "url": f"http://sim/{rid}",
                "adapters": [name for name, at in e.adapters.items() if at <= now],
            }
            for rid, e in self.engines.items()
        }
        self.fleet.heartbeat(self.node, {"replicas": reports})

    def account(self, seconds: float) -> None:
        awake = sum(e.gpus for e in self.engines.values() if e.state != "asleep")
        self.gpu_seconds_awake += awake * seconds


class Router:
    """gpurouter's part, modelled: least in flight among a model's routes; requests for a model
    with none are parked and told to the control plane; one activity report a second."""

    def __init__(self, fleet: Fleet, reconciler: Reconciler, s: Settings) -> None:
        self.fleet, self.reconciler, self.s = fleet, reconciler, s
        self.routes: dict[str, list[str]] = {}
        self.version = 0
        self.in_flight: dict[str, int] = defaultdict(int)
        self.last_used: dict[str, float] = {}
        self.watched_since: dict[str, float] = {}
        self.parked: dict[str, deque] = defaultdict(deque)
        self.done: list[tuple[float, str]] = []  # (when, replica): a heap of answers ending
        self.started = 0.0
        self.holds = None  # (endpoint, now) -> whether its engine serves what it is routed
        self.misses = 0

    def take_routes(self, now: float) -> None:
        table = self.reconciler.routes
        self.routes = {m: [e["id"] for e in eps] for m, eps in table.routes.items()}
        self.version = table.version
        ids = {rid for eps in self.routes.values() for rid in eps}
        self.watched_since = {rid: self.watched_since.get(rid, now) for rid in ids}
        for model, waiting in self.parked.items():
            while waiting and self.routes.get(model):
                self.send(waiting.popleft(), now)

    def arrive(self, request: Request, now: float) -> None:
        if self.routes.get(request.model):
            self.send(request, now)
            return
        request.parked = True
        self.parked[request.model].append(request)
        waiting = len(self.parked[request.model])
        if request.model in self.fleet.adapters:  # as the control plane's API tells them apart
            self.fleet.adapter_demand(request.model, waiting)
        else:
            self.fleet.demand(request.model, waiting)

    def send(self, request: Request, now: float) -> None:
        replica = min(self.routes[request.model], key=lambda rid: (self.in_flight[rid], rid))
        if self.holds is not None and not self.holds(replica, now):
            self.misses += 1  # it reached a replica without its adapter: a 404
        request.started = now
        self.in_flight[replica] += 1
        self.last_used[replica] = now
        heapq.heappush(self.done, (now + self.s.service_s, replica))

    def finish(self, now: float) -> None:
        while self.done and self.done[0][0] <= now:
            _, replica = heapq.heappop(self.done)
            self.in_flight[replica] -= 1
            self.last_used[replica] = now

    def expire(self, now: float) -> None:
        for waiting in self.parked.values():
            while waiting and now - waiting[0].at > self.s.park_timeout_s:
                waiting.popleft().refused = True

    def report(self, now: float) -> None:
        self.fleet.idle.report(
            {
                "router": "bench",
                "incarnation": "1",
                "uptime_s": now - self.started,
                "route_version": self.version,
                "used": {
                    rid: 0.0 if self.in_flight[rid] else now - at
                    for rid, at in self.last_used.items()
                    if rid in self.watched_since or self.in_flight[rid]
                },
                "watched": {rid: now - at for rid, at in self.watched_since.items()},
                "in_flight": {rid: n for rid, n in self.in_flight.items() if n},
                "waiting": {m: len(q) for m, q in self.parked.items() if q},
            }
        )


@dataclass
class Result:
    policy: str
    cards: int
    requests: int
    within_slo: int
    ttft: list[float]
    swapped_ttft: list[float]
    refused: int
    lost: int
    cold_starts: int
    wakes: int
    gpu_seconds_awake: float
    misses: int = 0  # requests that reached a replica without their adapter
    loads: int = 0  # adapter loads
    unloads: int = 0

    @property
    def attainment(self) -> float:
        return self.within_slo / self.requests if self.requests else 0.0

    def row(self) -> list[str]:
        return [
            self.policy,
            str(self.cards),
            str(self.requests),
            f"{100 * self.attainment:.1f}%",
            f"{percentile(self.ttft, 50):.2f}",
            f"{percentile(self.ttft, 99):.2f}",
            f"{percentile(self.swapped_ttft, 99):.2f}" if self.swapped_ttft else "-",
            str(self.cold_starts),
            str(self.wakes),
            f"{self.gpu_seconds_awake / 3600:.1f}",
            str(self.refused),
            str(self.lost),
        ]


HEADERS = [
    "policy", "cards", "requests", "within SLO", "p50 TTFT s", "p99 TTFT s",
    "p99 swapped s", "cold starts", "wakes", "GPU-h awake", "refused", "lost",
]  # fmt: skip


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.inf
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def run(
    policy: str,
    requests: list[Request],
    s: Settings,
    workdir: Path,
    bodies: list[dict] | None = None,
    warm: list[str] | None = None,
) -> Result:
    """Play `requests` against a fleet of `s.cards` cards (three times that for dedicated)
    given `bodies` to apply (models and adapters; default: `s.models` models for `policy`),
    each of `warm` (default: the models) asked for every 20 s before the trace starts."""
    cards = s.cards * (3 if policy == "dedicated" else 1)
    names = model_names(s.models)
    bodies = bodies if bodies is not None else [spec_for(n, policy, s) for n in names]
    warm = names if warm is None else warm
    clock = Clock()
    store = SqliteStore(workdir / f"{policy}.sqlite")
    try:
        fleet = Fleet(store, IdleTracker(live_window_s=10, clock=clock), clock=clock, wall=clock)
        reconciler = Reconciler(fleet, node_timeout_s=15, min_residency_s=s.residency_s)
        agents = []
        for n in range(math.ceil(cards / 8)):
            name = f"node-{n}"
            gpus = [
                {"index": i, "uuid": f"{name}-{i}", "gpu_class": "H100-80GB", "memory_mb": CARD_MB}
                for i in range(min(8, cards - 8 * n))
            ]
            fleet.register(
                {
                    "name": name,
                    "address": "127.0.0.1",
                    "fabric": "f",
                    "gpus": gpus,
                    "host_memory_mb": HOST_MB,
                }  # fmt: skip
            )
            agents.append(Agent(fleet, name, s))
        for body in bodies:
            if body.get("kind") == "adapter":
                fleet.apply_adapter(body)
            else:
                fleet.apply(body)
        router = Router(fleet, reconciler, s)

        def holds(endpoint: str, now: float) -> bool:
            replica, sep, adapter = endpoint.partition("@")
            engine = next((a.engines.get(replica) for a in agents if replica in a.engines), None)
            return not sep or (engine is not None and engine.adapters.get(adapter, now + 1) <= now)

        router.holds = holds
        # Before the trace, each policy settles: every model is asked for every 20 s, so that
        # what a policy keeps loaded (asleep, for one that sleeps) is loaded when it starts.
        warmup = s.warmup_minutes * 60
        played = [Request(r.at + warmup, r.model) for r in requests]
        asks = [Request(float(at), name) for at in range(0, int(warmup) - 120, 20)
                for name in warm]  # fmt: skip
        pending = deque(sorted(asks) + sorted(played))
        end = s.minutes * 60 + s.park_timeout_s + warmup
        next_report = 0.0
        while clock.now < end:
            now = clock.now
            for agent in agents:
                agent.beat(now)
            reconciler.tick()
            router.take_routes(now)
            if now >= next_report:
                router.report(now)
                next_report = now + REPORT_S
            step_end = now + TICK_S
            while pending and pending[0].at < step_end:
                request = pending.popleft()
                clock.now = max(now, request.at)
                router.finish(clock.now)
                router.arrive(request, clock.now)
            clock.now = step_end
            router.finish(clock.now)
            router.expire(clock.now)
            for agent in agents:
                agent.account(TICK_S)
        served = [r for r in played if r.started >= 0]
        ttft = [r.started - r.at + s.engine_ttft_s for r in served]
        swapped = [r.started - r.at + s.engine_ttft_s for r in served if r.parked]
        refused = sum(r.refused for r in played)
        return Result(
            policy,
            cards,
            len(played),
            sum(t <= s.slo_s for t in ttft),
            ttft,
            swapped,
            refused,
            len(played) - len(served) - refused,
            sum(a.cold_starts for a in agents),
            sum(a.wakes for a in agents),
            sum(a.gpu_seconds_awake for a in agents),
            router.misses,
            sum(fleet.adapter_loads.values()),
            sum(fleet.adapter_unloads.values()),
        )
    finally:
        store.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def compare(s: Settings, policies=POLICIES) -> dict[str, Result]:
    requests = trace(s)
    with tempfile.TemporaryDirectory() as tmp:
        return {policy: run(policy, requests, s, Path(tmp)) for policy in policies}


def table(results: dict[str, Result]) -> str:
    return markdown_table([HEADERS] + [r.row() for r in results.values()])


def markdown_table(rows: list[list[str]]) -> str:
    """`rows` (headers first) as a Markdown table, for release notes."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]  # fmt: skip
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    for name, value in vars(defaults).items():
        if name == "cv":
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--cv", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    args = vars(parser.parse_args())
    for cv in args.pop("cv"):
        settings = Settings(**args, cv=cv)
        results = compare(settings)
        sleep, cold, dedicated = results["sleep"], results["cold"], results["dedicated"]
        print(
            f"\n{settings.models} models on {settings.cards} cards, {settings.minutes:g} min,"
            f" {settings.rate:g} req/s, CV {cv:g}, Zipf {settings.zipf:g}; cold start"
            f" {settings.cold_start_s:g} s, wake {settings.wake_s:g} s, SLO {settings.slo_s:g} s"
        )
        print(table(results))
        print(
            f"sleep against cold: {sleep.attainment / max(cold.attainment, 1e-9):.2f}x the SLO"
            f" attainment; against dedicated: {sleep.attainment / dedicated.attainment:.2f}x on"
            f" {sleep.cards / dedicated.cards:.2f} of its cards; p99 swapped TTFT"
            f" {percentile(sleep.swapped_ttft, 99):.2f} s against 1.5 x wake + one tick ="
            f" {1.5 * settings.wake_s + TICK_S:.2f} s"
        )


if __name__ == "__main__":
    main()

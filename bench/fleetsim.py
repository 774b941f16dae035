"""The real control plane (Fleet, Reconciler, their steps, on SQLite) driven on a virtual clock
by models of the processes around it, with the timing those processes have by default.

| part          | what is modelled                              | timing, by default              |
|---------------|-----------------------------------------------|---------------------------------|
| control plane | the real one: a tick every `tick_s`, and soon | controlplane.server.Settings    |
|               | after a call that changed state (a demand, a  |                                 |
|               | prompt report, a heartbeat with news)         |                                 |
| agent         | orders by its watch; heartbeats at the period | rules.pacing; orders            |
|               | the server hands out; an engine that finished | `order_delay_s` after the tick  |
|               | a move is reported at once                    |                                 |
| engines       | `slots` requests at once, a FIFO queue behind;| bench/multiplex.py's Settings   |
|               | a request's prefill and decode at its model's |  and Size (speeds and wakes by  |
|               | speeds; sleep and wake move weights over the  |  model size)                    |
|               | node's host link, shared by every move on it; |                                 |
|               | the engines awake on one card share its       |                                 |
|               | compute                                       |                                 |
| router        | least in flight; parks requests for a model   | router.server.Settings; routes  |
|               | with no route; acks (a report) at once on a   | `route_delay_s` after the tick  |
|               | new table and when a withdrawn replica drains;|                                 |
|               | counts the requests it sends each replica     |                                 |

Engines on one card share its compute by processor sharing: while k of them run requests, each
runs at 1/k of its speed alone (a request's first token and its end both come k times later).
That is a pessimistic bound, and an honest one: it assumes each engine alone saturates the card,
where a small model's decode steps leave most of an H100's compute idle (memory-bound), so
real co-resident engines slow each other less (MuxServe and Prism measure 1.8-3.3x the
attainment of a card per model); and an engine's own batch (`slots`) still costs it nothing.

What the real parts would do to a request is counted, never forgiven: a request sent to an
engine that is not awake, or to a replica without its adapter, fails; a request running or
queued on an engine that is stopped, put to sleep or has its adapter unloaded is cut.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.rules.pacing import HeartbeatPacing
from controlplane.server import PACED_TICK_S
from controlplane.server import Settings as ServerSettings
from controlplane.state.orders import digest
from controlplane.state.routetable import resolver_endpoints
from router.path.context import ProxyConfig
from router.server import RouterSettings

# One place for the defaults: the processes' own settings, not figures of this bench's choosing.
SERVER = ServerSettings("127.0.0.1", 0, "", {})
TICK_S = SERVER.tick_s
PACING = HeartbeatPacing(SERVER.heartbeat_s, SERVER.max_heartbeats_per_s, SERVER.node_timeout_s)
REPORT_S = RouterSettings.__dataclass_fields__["tick_s"].default
PARK_TIMEOUT_S = ProxyConfig().park_timeout_s
MOVE_STEP_S = 0.05  # how finely weights moving over a shared host link are stepped


@dataclass(eq=False)
class Request:
    at: float
    model: str
    first_token: float = -1.0
    parked: bool = False
    refused: bool = False
    failed: bool = False  # sent to an engine that could not serve it
    cut: bool = False  # cut by a stop, a sleep or an unload
    replica: str = ""
    # Compute, in seconds of its engine alone on its cards: all of it, the part done when its
    # first token comes, and the part done as of `done_at`.
    work_s: float = 0.0
    first_at_s: float = 0.0
    done_s: float = 0.0
    done_at: float = 0.0
    finish_event: int = 0  # the finish scheduled last (a change of speed moves it)
    prompt_tokens: int = 0  # 0: every request alike (Timing.service_s)
    output_tokens: int = 0
    found: str = ""  # parked: what it found of its model, "asleep" or "cold" (nothing)

    def advance(self, now: float, speed: float) -> None:
        """Its compute from `done_at` to `now` at `speed`; its first token when it passes."""
        before = self.done_s
        self.done_s += (now - self.done_at) * speed
        if self.first_token < 0 and self.done_s >= self.first_at_s - 1e-12:
            self.first_token = self.done_at + (self.first_at_s - before) / speed
        self.done_at = now

    @property
    def ttft(self) -> float:
        return self.first_token - self.at


@dataclass
class Timing:
    cold_start_s: float
    wake_s: float
    sleep_s: float
    engine_ttft_s: float
    service_s: float
    slots: int
    adapter_load_s: float
    route_delay_s: float
    order_delay_s: float
    host_links: int
    # model -> (prefill tokens/s, decode tokens/s of one request alone, its sleep and wake as
    # a multiple of sleep_s and wake_s); None: every model alike (service_s, engine_ttft_s)
    model_speed: Callable[[str], tuple[float, float, float]] | None = None

    def move_factor(self, model: str) -> float:
        return 1.0 if self.model_speed is None else self.model_speed(model)[2]


class Events:
    """A virtual clock and what is due on it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.heap: list = []
        self.seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    def at(self, when: float, action, *args) -> None:
        heapq.heappush(self.heap, (max(when, self.now), next(self.seq), action, args))

    def run_until(self, end: float) -> None:
        while self.heap and self.heap[0][0] <= end:
            when, _, action, args = heapq.heappop(self.heap)
            self.now = when
            action(*args)
        self.now = end


@dataclass(eq=False)
class Engine:
    replica: str
    model: str
    gpus: int
    state: str  # starting, ready, sleeping, asleep, waking
    left_s: float = 0.0  # of a move's exclusive transfer time (sleeping, waking)
    ready_at: float = 0.0  # starting: when it serves
    # requests it runs, as an ordered set (a dict): a set of objects hashed by identity would
    # iterate in an order that differs from run to run, and so would the figures
    running: dict = field(default_factory=dict)
    queue: deque = field(default_factory=deque)
    adapters: dict[str, float] = field(default_factory=dict)  # name -> loaded from then
    assigned: set = field(default_factory=set)  # adapters it was ever told to hold
    cards: list = field(default_factory=list)  # (node, index) of each of its cards
    speed: float = 1.0  # of its speed alone: 1/k while k engines on a card of it run requests

    def holds(self, adapter: str, now: float) -> bool:
        return self.adapters.get(adapter, now + 1) <= now


REPORTED = {
    "starting": "Starting",
    "ready": "Ready",
    "sleeping": "Ready",  # vLLM answers /health while it offloads: Ready until asleep
    "asleep": "Asleep",
    "waking": "Waking",
}


def awake_with_adapter(engine: Engine, request: Request, now: float) -> bool:
    """What gpufleet's router relies on: the engine is awake and holds the request's adapter
    (its endpoint `REPLICA@ADAPTER` says which, `request.replica`)."""
    adapter = request.replica.partition("@")[2]
    return engine.state == "ready" and (not adapter or engine.holds(adapter, now))


class Node:
    """One node's agent and its engines."""

    def __init__(self, sim: Sim, name: str) -> None:
        self.sim, self.name = sim, name
        self.engines: dict[str, Engine] = {}
        self.held = ""  # digest of the assignments carried out
        self.moving = False  # a move step is scheduled

    # orders

    def take_orders(self) -> None:
        sim = self.sim
        wanted = {a["replica"]: a for a in sim.fleet.assignments(self.name)}
        self.held = digest(list(wanted.values()))
        now = sim.events.now
        for rid in list(self.engines):
            if rid not in wanted:
                sim.cut_all(self.engines.pop(rid))
        for rid, a in wanted.items():
            engine = self.engines.get(rid)
            if engine is None:
                engine = self.engines[rid] = Engine(rid, a["model"], len(a["gpus"]), "starting")
                engine.cards = [(self.name, index) for index in a["gpus"]]
                engine.ready_at = now + sim.timing.cold_start_s
                sim.events.at(engine.ready_at, self.started, engine)
                sim.count("cold_starts")
            elif a["sleep"] and engine.state == "ready":
                sim.cut_all(engine)
                engine.state = "sleeping"
                engine.left_s = sim.timing.sleep_s * sim.timing.move_factor(engine.model)
                self.move_soon()
            elif not a["sleep"] and engine.state == "asleep":
                engine.state = "waking"
                engine.left_s = sim.timing.wake_s * sim.timing.move_factor(engine.model)
                sim.count("wakes")
                self.move_soon()
            wanted_adapters = [x["name"] for x in a.get("adapters", ())]
            engine.assigned.update(wanted_adapters)
            # Only what it was told to hold is unloaded: an engine that loads adapters itself
            # may hold one the control plane has not taken on yet (the agent's rule).
            for name in [n for n in engine.adapters
                         if n not in wanted_adapters and n in engine.assigned]:  # fmt: skip
                engine.assigned.discard(name)
                sim.cut_adapter(engine, name)
                del engine.adapters[name]
                sim.count("adapter_unloads")
            for name in wanted_adapters:
                if name not in engine.adapters:
                    loaded = now + sim.timing.adapter_load_s
                    engine.adapters[name] = loaded
                    sim.count("adapter_loads")
                    sim.events.at(loaded, self.beat)

    def started(self, engine: Engine) -> None:
        if self.engines.get(engine.replica) is engine and engine.state == "starting":
            engine.state = "ready"
            self.beat()

    def move_soon(self) -> None:
        if not self.moving:
            self.moving = True
            self.sim.events.at(self.sim.events.now + MOVE_STEP_S, self.move)

    def move(self) -> None:
        """Sleeps and wakes share the node's host links: past `host_links` moves at once, each
        moves host_links/n as fast."""
        self.moving = False
        movers = [e for e in self.engines.values() if e.state in ("sleeping", "waking")]
        if not movers:
            return
        done = False
        speed = min(1.0, self.sim.timing.host_links / len(movers))
        for engine in movers:
            engine.left_s -= MOVE_STEP_S * speed
            if engine.left_s <= 1e-9:
                engine.state = "asleep" if engine.state == "sleeping" else "ready"
                done = True
        if done:
            self.beat()  # news: reported at once
        self.move_soon()

    # heartbeats

    def beat(self) -> None:
        sim = self.sim
        now = sim.events.now
        reports = {
            rid: {
                "state": REPORTED[e.state],
                "url": f"http://sim/{rid}",
                "adapters": [name for name in e.adapters if e.holds(name, now)],
            }
            for rid, e in self.engines.items()
        }
        sim.fleet.heartbeat(self.name, {"replicas": reports})
        if sim.fleet.changed:
            sim.wake()

    def beat_periodically(self) -> None:
        self.beat()
        period = PACING.period(len(self.sim.nodes))
        self.sim.events.at(self.sim.events.now + period, self.beat_periodically)

    def awake_gpus(self) -> int:
        return sum(e.gpus for e in self.engines.values() if e.state != "asleep")


class Router:
    """gpurouter's part: routes, parking, least in flight, activity reports."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.routes: dict[str, list[str]] = {}
        self.resolvers: dict[str, list[str]] = {}  # adapter -> endpoints that may load it
        self.version = 0
        self.in_flight: dict[str, int] = defaultdict(int)
        self.last_used: dict[str, float] = {}
        self.watched_since: dict[str, float] = {}
        self.parked: dict[str, deque] = defaultdict(deque)
        self.sent: dict[str, int] = defaultdict(int)  # endpoint -> requests sent, as its slot
        self.route_of = lambda model: model  # the route a request for `model` takes

    def take_routes(self, routes: dict, version: int, resolvers: dict | None = None) -> None:
        now = self.sim.events.now
        if version <= self.version:
            return
        self.routes, self.version = routes, version
        self.resolvers = resolvers or {}
        ids = {rid for eps in routes.values() for rid in eps}
        for rid in [r for r in self.sent if r not in ids]:
            del self.sent[rid]  # its slot goes: a new one counts from 0
        self.watched_since = {rid: self.watched_since.get(rid, now) for rid in ids}
        for model, waiting in self.parked.items():
            while waiting and self.routes.get(self.route_of(model)):
                self.send(waiting.popleft())
        self.report()  # an ack at once

    def arrive(self, request: Request) -> None:
        if self.routes.get(self.route_of(request.model)):
            self.send(request)
            return
        request.parked = True
        request.found = "asleep" if self.sim.asleep(request.model) else "cold"
        waiting = self.parked[request.model]
        waiting.append(request)
        self.sim.events.at(request.at + PARK_TIMEOUT_S, self.expire, request)
        fleet = self.sim.fleet
        if request.model in fleet.adapters:  # as the control plane's API tells them apart
            fleet.adapter_demand(request.model, len(waiting))
        else:
            fleet.demand(request.model, len(waiting))
        self.sim.wake()

    def send(self, request: Request) -> None:
        now = self.sim.events.now
        endpoint = min(
            self.routes[self.route_of(request.model)], key=lambda e: (self.in_flight[e], e)
        )
        request.replica = endpoint
        self.in_flight[endpoint] += 1
        self.sent[endpoint] += 1
        self.last_used[endpoint] = now
        self.sim.serve(request, endpoint)

    def done(self, request: Request) -> None:
        endpoint = request.replica
        self.in_flight[endpoint] -= 1
        self.last_used[endpoint] = self.sim.events.now
        if not self.in_flight[endpoint] and endpoint not in self.watched_since:
            self.report()  # the last request on a withdrawn replica: an ack at once

    def expire(self, request: Request) -> None:
        waiting = self.parked[request.model]
        if request in waiting:
            waiting.remove(request)
            request.refused = True

    def report(self) -> None:
        now = self.sim.events.now
        self.sim.fleet.idle.report(
            {
                "router": "bench",
                "incarnation": "1",
                "uptime_s": now,
                "route_version": self.version,
                "used": {
                    rid: 0.0 if self.in_flight[rid] else now - at
                    for rid, at in self.last_used.items()
                    if rid in self.watched_since or self.in_flight[rid]
                },
                "watched": {rid: now - at for rid, at in self.watched_since.items()},
                "in_flight": {rid: n for rid, n in self.in_flight.items() if n},
                "requests": {rid: n for rid, n in self.sent.items() if rid in self.watched_since},
                "waiting": {m: len(q) for m, q in self.parked.items() if q},
            }
        )
        self.sim.wake()

    def report_periodically(self) -> None:
        self.report()
        self.sim.events.at(self.sim.events.now + REPORT_S, self.report_periodically)


class Sim:
    """One fleet on a virtual clock: the control plane's ticks, agents, engines, a router."""

    def __init__(self, fleet, reconciler, nodes: list[str], timing: Timing, window, events):
        self.fleet, self.reconciler, self.timing = fleet, reconciler, timing
        self.events: Events = events
        self.window = window  # (start, end) of what is counted
        self.nodes = {name: Node(self, name) for name in nodes}
        self.router = Router(self)
        self.counters: dict[str, int] = defaultdict(int)
        # card -> engines running requests on it (an ordered set, as Engine.running)
        self.running_on: dict[tuple, dict] = defaultdict(dict)
        self.gpu_seconds_awake = 0.0
        self.tick_due = 0.0
        self.last_tick = -1.0
        self.published = -1
        # (engine, request, now) -> whether the engine can serve the request; another engine
        # model (vLLM's own adapter cache) replaces it
        self.serves = awake_with_adapter

    def count(self, what: str) -> None:
        if self.window[0] <= self.events.now < self.window[1]:
            self.counters[what] += 1

    # the control plane

    def wake(self) -> None:
        """A call changed state: the next tick comes soon (the server's own pacing)."""
        soon = max(self.events.now, self.last_tick + PACED_TICK_S)
        if soon < self.tick_due:
            self.tick_due = soon
            self.events.at(soon, self.tick)

    def tick(self) -> None:
        now = self.events.now
        if now < self.tick_due - 1e-9:
            return  # a tick moved earlier since this one was due
        self.reconciler.tick()
        self.fleet.idle.forget_gone()
        self.fleet.changed = False
        self.last_tick = now
        self.tick_due = now + TICK_S
        self.events.at(self.tick_due, self.tick)
        table = self.reconciler.routes
        if table.version != self.published:
            self.published = table.version
            routes = {m: [e["id"] for e in eps] for m, eps in table.routes.items()}
            resolvers = {
                adapter: [e["id"] for e in resolver_endpoints(table.resolvers, adapter)]
                for entry in table.resolvers.values()
                for adapter in entry["adapters"]
            }
            self.events.at(now + self.timing.route_delay_s, self.router.take_routes, routes,
                           table.version, resolvers)  # fmt: skip
        for node in self.nodes.values():
            if digest(self.fleet.assignments(node.name)) != node.held:
                self.events.at(now + self.timing.order_delay_s, node.take_orders)

    # engines

    def engine(self, endpoint: str) -> Engine | None:
        replica = endpoint.partition("@")[0]
        for node in self.nodes.values():
            if replica in node.engines:
                return node.engines[replica]
        return None

    def asleep(self, model: str) -> bool:
        """Whether an engine of `model` sleeps (or is on its way to or from sleep)."""
        return any(
            e.model == model and e.state in ("sleeping", "asleep", "waking")
            for node in self.nodes.values()
            for e in node.engines.values()
        )

    def serve(self, request: Request, endpoint: str) -> None:
        now = self.events.now
        engine = self.engine(endpoint)
        if engine is None or not self.serves(engine, request, now):
            request.failed = True
            self.events.at(now, self.router.done, request)
            return
        engine.queue.append(request)
        self.drain_queue(engine)

    def drain_queue(self, engine: Engine) -> None:
        """FIFO into the engine's free slots (another engine model may replace this)."""
        while engine.queue and len(engine.running) < self.timing.slots:
            self.start(engine, engine.queue.popleft())

    def start(self, engine: Engine, request: Request, extra_s: float = 0.0) -> None:
        """`extra_s`: what the engine does for it before its answer (an adapter's load)."""
        now = self.events.now
        speed = self.timing.model_speed
        if speed is not None and request.output_tokens:
            prefill, decode, _ = speed(engine.model)
            request.first_at_s = extra_s + request.prompt_tokens / prefill + 1 / decode
            request.work_s = request.first_at_s + (request.output_tokens - 1) / decode
        else:
            request.work_s = extra_s + self.timing.service_s
            request.first_at_s = extra_s + self.timing.engine_ttft_s
        request.done_s, request.done_at = 0.0, now
        engine.running[request] = None
        if len(engine.running) == 1:
            self.share_changed(engine)
        self.schedule_finish(engine, request)

    def schedule_finish(self, engine: Engine, request: Request) -> None:
        request.finish_event += 1
        left = (request.work_s - request.done_s) / engine.speed
        self.events.at(self.events.now + left, self.finish, engine, request,
                       request.finish_event)  # fmt: skip

    def share_changed(self, engine: Engine) -> None:
        """`engine` began or ceased to run requests: the engines on its cards share them anew."""
        now = self.events.now
        for card in engine.cards:
            if engine.running:
                self.running_on[card][engine] = None
            else:
                self.running_on[card].pop(engine, None)
        touched = {e: None for card in engine.cards for e in self.running_on[card]}
        touched[engine] = None
        for other in touched:
            busiest = max((len(self.running_on[c]) for c in other.cards), default=1)
            speed = 1.0 / max(1, busiest)
            if speed == other.speed:
                continue
            for request in other.running:
                request.advance(now, other.speed)
            other.speed = speed
            for request in other.running:
                self.schedule_finish(other, request)

    def finish(self, engine: Engine, request: Request, event: int = 0) -> None:
        if request.cut or request not in engine.running or event != request.finish_event:
            return
        request.advance(self.events.now, engine.speed)
        engine.running.pop(request, None)
        if not engine.running:
            self.share_changed(engine)
        self.router.done(request)
        if engine.state == "ready":
            self.drain_queue(engine)

    def cut(self, engine: Engine, requests) -> None:
        for request in list(requests):
            request.cut = True
            if request in engine.running:
                request.advance(self.events.now, engine.speed)
            engine.running.pop(request, None)
            if request in engine.queue:
                engine.queue.remove(request)
            self.router.done(request)
        if not engine.running:
            self.share_changed(engine)

    def cut_all(self, engine: Engine) -> None:
        self.cut(engine, list(engine.running) + list(engine.queue))

    def cut_adapter(self, engine: Engine, adapter: str) -> None:
        self.cut(engine, [r for r in [*engine.running, *engine.queue] if r.model == adapter])

    # the run

    def account(self) -> None:
        now = self.events.now
        if self.window[0] <= now < self.window[1]:
            self.gpu_seconds_awake += sum(n.awake_gpus() for n in self.nodes.values())
        self.events.at(now + 1.0, self.account)

    def run(self, requests: list[Request], end: float) -> None:
        for node in self.nodes.values():
            node.beat_periodically()
        self.router.report_periodically()
        self.events.at(0.0, self.tick)
        self.events.at(0.0, self.account)
        for request in requests:
            self.events.at(request.at, self.router.arrive, request)
        self.events.run_until(end)

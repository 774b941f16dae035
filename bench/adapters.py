"""Hundreds of fine-tunes on a few cards: as LoRA adapters gpufleet places, as vLLM's own
adapter cache, or as models of their own that sleep.

    python -m bench.adapters [--adapters 200] [--cards 4] [--max-adapters 8] [--minutes 10] ...

One trace (Zipf popularity over the fine-tunes, bursty gamma arrivals; bench/multiplex.py's)
against the same cards three ways:

- `adapters`: one base model, a replica on each card holding up to `--max-adapters` adapters;
  the control plane loads them where a request waits and unloads the idlest past its
  `idle_after` under pressure, through the safe stop; the router sends a request only to a
  replica that holds its adapter.
- `resolver`: as `adapters`, on engines that load an adapter themselves on a first request
  (vLLM's LoRA resolver; `adapter_resolver: true`): a request that no holder can take at
  once (every holder's `slots` busy) goes to the least-loaded replica of the base with a free
  adapter slot, as the control plane publishes them, whose engine loads it (`--adapter-load-s`)
  and serves it; the control plane learns the holding from the engine and keeps placing and
  unloading by its rules.
- `vllm-native`: every adapter registered on every replica, the router balancing over the
  base's replicas alone; each engine keeps `--max-adapters` adapters on the GPU (vLLM's
  `--max-loras`) and as many again in host memory (`--max-cpu-loras`, its default), least
  recently used swapped out by the engine itself: a load from disk costs `--adapter-load-s`,
  from host memory a tenth of it, and a request whose adapter finds every GPU slot in use by
  running requests waits in the engine's queue (vLLM's scheduler passes it over meanwhile).
- `models-sleep`: each fine-tune a model of its own, sleeping when idle and waking on request.

The control plane is the real one on a virtual clock; the processes around it are
bench/fleetsim.py's, at their defaults. Reported per way: requests within the TTFT SLO, p99
TTFT, loads and unloads per minute, requests sent where their adapter was not (failed),
requests cut by an unload, refusals.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import OrderedDict, defaultdict
from dataclasses import replace
from pathlib import Path

from bench.fleetsim import Engine, Request, Sim
from bench.multiplex import (
    Settings,
    markdown_table,
    model_names,
    percentile,
    run,
    spec_for,
    trace,
)

BASE = "base"
WAYS = ("adapters", "resolver", "vllm-native", "models-sleep")


def bodies_for_adapters(s: Settings, max_adapters: int, idle_after_s: float) -> list[dict]:
    adapters = [
        {"kind": "adapter", "name": name, "base": BASE, "source": f"s3://loras/{name}",
         "idle_after": idle_after_s}
        for name in model_names(s.models)
    ]  # fmt: skip
    return [base_body(s, max_adapters), *adapters]


def base_body(s: Settings, max_adapters: int = 0, resolver: bool = False) -> dict:
    body = {**spec_for(BASE, "pinned", s), "replicas": s.cards}
    body |= {"max_adapters": max_adapters} if max_adapters else {}
    return body | ({"adapter_resolver": True} if resolver else {})


class ResolverEngines:
    """Engines with a LoRA resolver and the router that uses them (router/control/resolvers.py): a
    request for an adapter goes to a holder with a free slot, else to the least-loaded of its
    resolvers (whose engine loads it first), else to the least-loaded holder, else waits for
    the control plane as before."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def install(self) -> None:
        sim = self.sim
        router = sim.router
        arrive = router.arrive
        sim.serves = lambda engine, request, now: engine.state == "ready"
        start = sim.start

        def start_loading(engine: Engine, request: Request, extra_s: float = 0.0) -> None:
            now = sim.events.now
            adapter = request.model
            if adapter != BASE:
                loaded_at = engine.adapters.get(adapter)
                if loaded_at is None:  # its resolver loads it, then reports it held
                    loaded_at = engine.adapters[adapter] = now + sim.timing.adapter_load_s
                    sim.count("adapter_loads")
                    node = sim.nodes[engine.cards[0][0]]
                    sim.events.at(loaded_at, node.beat)
                extra_s = max(extra_s, loaded_at - now)
            start(engine, request, extra_s)

        def arrive_here(request: Request) -> None:
            holders = router.routes.get(request.model) or []
            free = [e for e in holders if self.free(e)]
            resolvers = router.resolvers.get(request.model) or []
            if free:
                self.send(request, free)
            elif resolvers:
                self.send(request, resolvers)
            else:
                arrive(request)

        sim.start = start_loading
        router.arrive = arrive_here

    def free(self, endpoint: str) -> bool:
        engine = self.sim.engine(endpoint)
        return (
            engine is not None
            and engine.state == "ready"
            and len(engine.running) + len(engine.queue) < self.sim.timing.slots
        )

    def send(self, request: Request, endpoints: list[str]) -> None:
        """To the endpoint whose replica carries the fewest of this router's requests."""
        router, sim = self.router, self.sim
        load = defaultdict(int)
        for endpoint, n in router.in_flight.items():
            load[endpoint.partition("@")[0]] += n
        endpoint = min(endpoints, key=lambda e: (load[e.partition("@")[0]], e))
        request.replica = endpoint
        router.in_flight[endpoint] += 1
        router.last_used[endpoint] = sim.events.now
        sim.serve(request, endpoint)

    @property
    def router(self):
        return self.sim.router


class NativeLoraCache:
    """vLLM's adapter cache in each engine: `max_loras` on the GPU, `max_cpu_loras` in host
    memory, least recently used first out; the scheduler starts a request whose adapter is on
    the GPU, or can be loaded into a slot no running request uses, and passes it over else."""

    def __init__(self, sim: Sim, max_loras: int, max_cpu_loras: int) -> None:
        self.sim, self.max_loras, self.max_cpu_loras = sim, max_loras, max_cpu_loras
        self.gpu: dict[str, OrderedDict] = {}  # replica -> adapter -> requests running
        self.cpu: dict[str, OrderedDict] = {}  # replica -> adapters in host memory

    def install(self) -> None:
        sim = self.sim
        sim.router.route_of = lambda model: BASE
        sim.serves = lambda engine, request, now: engine.state == "ready"
        sim.drain_queue = self.drain_queue
        finish = sim.finish

        def finished(engine: Engine, request: Request, event: int = 0) -> None:
            # A finish moved later by a change of speed is not the request's end.
            if request in engine.running and event == request.finish_event and not request.cut:
                self.gpu[engine.replica][request.model] -= 1
            finish(engine, request, event)

        sim.finish = finished

    def drain_queue(self, engine: Engine) -> None:
        sim = self.sim
        gpu = self.gpu.setdefault(engine.replica, OrderedDict())
        for request in list(engine.queue):
            if len(engine.running) >= sim.timing.slots:
                return
            load_s = self.make_room(engine.replica, gpu, request.model)
            if load_s is None:
                continue  # passed over until a slot frees
            engine.queue.remove(request)
            gpu[request.model] = gpu.get(request.model, 0) + 1
            gpu.move_to_end(request.model)
            sim.start(engine, request, extra_s=load_s)

    def make_room(self, replica: str, gpu: OrderedDict, adapter: str) -> float | None:
        """The load time for `adapter` (0 if on the GPU), or None when no slot can take it."""
        if adapter in gpu:
            return 0.0
        if len(gpu) >= self.max_loras:
            idle = next((name for name, running in gpu.items() if running == 0), None)
            if idle is None:
                return None
            del gpu[idle]
            cpu = self.cpu.setdefault(replica, OrderedDict())
            cpu[idle] = None
            while len(cpu) > self.max_cpu_loras:
                cpu.popitem(last=False)
        self.sim.count("adapter_loads")
        cpu = self.cpu.setdefault(replica, OrderedDict())
        if adapter in cpu:
            del cpu[adapter]
            return self.sim.timing.adapter_load_s / 10
        return self.sim.timing.adapter_load_s


def compare(
    s: Settings, max_adapters: int = 8, idle_after_s: float = 10.0, ways=WAYS, progress=None
) -> dict:
    """Each way's result on one trace; `progress(way, result, seconds)` after each."""
    arrivals = trace(s)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way in ways:
            began = time.monotonic()
            if way == "adapters":
                bodies = bodies_for_adapters(s, max_adapters, idle_after_s)
                out[way] = run("pinned", arrivals, s, Path(tmp), bodies, warm=[], cards=s.cards)
            elif way == "resolver":
                bodies = bodies_for_adapters(s, max_adapters, idle_after_s)
                bodies[0] = base_body(s, max_adapters, resolver=True)
                out[way] = run(
                    "resolver",
                    arrivals,
                    s,
                    Path(tmp),
                    bodies,
                    warm=[],
                    cards=s.cards,
                    prepare=lambda sim: ResolverEngines(sim).install(),
                )
            elif way == "vllm-native":
                out[way] = run(
                    "native",
                    arrivals,
                    s,
                    Path(tmp),
                    [base_body(s)],
                    warm=[],
                    cards=s.cards,
                    prepare=lambda sim: NativeLoraCache(sim, max_adapters, max_adapters).install(),
                )
            else:
                # Every fine-tune asked for in a warm-up long enough to cold-start them all,
                # a card at a time: what fits in host memory waits asleep.
                starts_min = s.models / s.cards * s.cold_start_s / 60
                settled = replace(s, warmup_minutes=max(s.warmup_minutes, starts_min + 3))
                out[way] = run("sleep", arrivals, settled, Path(tmp),
                               warm=model_names(s.models), cards=s.cards)  # fmt: skip
            out[way].policy = way
            if progress is not None:
                progress(way, out[way], time.monotonic() - began)
    return out


def table(results: dict, minutes: float) -> str:
    headers = ["way", "requests", "within SLO", "p50 TTFT s", "p99 TTFT s", "loads/min",
               "unloads/min", "cold starts", "wakes", "failed", "cut", "refused"]  # fmt: skip
    rows = [headers]
    for way, r in results.items():
        rows.append(
            [
                way,
                str(r.requests),
                f"{100 * r.attainment:.1f}%",
                f"{percentile(r.ttft, 50):.2f}",
                f"{percentile(r.ttft, 99):.2f}",
                f"{r.loads / minutes:.1f}",
                f"{r.unloads / minutes:.1f}",
                str(r.cold_starts),
                str(r.wakes),
                str(r.failed),
                str(r.cut),
                str(r.refused),
            ]
        )
    return markdown_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=200)
    parser.add_argument("--cards", type=int, default=4)
    parser.add_argument("--max-adapters", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--cv", type=float, default=2.0)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--slo", type=float, default=5.0)
    parser.add_argument("--adapter-load-s", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--idle-after", type=float, default=10.0, help="adapters' idle_after (a reload is cheap)"
    )
    parser.add_argument(
        "--ways",
        nargs="+",
        choices=WAYS,
        default=["adapters", "resolver", "vllm-native"],
        help="models-sleep (each fine-tune a model that sleeps) cold-starts every one in its"
        " warm-up: minutes more per hundred fine-tunes",
    )
    args = parser.parse_args()
    s = replace(
        Settings(sized=False),
        models=args.adapters,
        cards=args.cards,
        minutes=args.minutes,
        rate=args.rate,
        cv=args.cv,
        zipf=args.zipf,
        slo_s=args.slo,
        adapter_load_s=args.adapter_load_s,
        warmup_minutes=3.0,
        seed=args.seed,
    )
    print(
        f"{args.adapters} fine-tunes on {args.cards} cards ({args.max_adapters} adapters a"
        f" replica), {args.minutes:g} min at {args.rate:g} req/s, CV {args.cv:g}, Zipf"
        f" {args.zipf:g}; SLO {args.slo:g} s; adapters' idle_after {args.idle_after:g} s;"
        f" ways: {', '.join(args.ways)} (10-20 s each on two cores"
        + ("; models-sleep far longer" if "models-sleep" in args.ways else "")
        + ")",
        flush=True,
    )

    def progress(way, result, seconds):
        print(f"  {way}: {100 * result.attainment:.1f}% within the SLO, p99 TTFT"
              f" {percentile(result.ttft, 99):.2f} s ({seconds:.0f} s)", flush=True)  # fmt: skip

    results = compare(s, args.max_adapters, args.idle_after, args.ways, progress)
    print(table(results, args.minutes))


if __name__ == "__main__":
    main()

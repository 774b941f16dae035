"""More models than cards: one trace, four policies, the control plane's own decisions.

    python -m bench.multiplex [--models 24] [--cards 8] [--minutes 30] [--cv 1 2 4]
                              [--seeds 7 8 9] [--wake-s 2] [--cold-start-s 60]
                              [--trace zipf|aegaeon] ...
    python -m bench.multiplex --sweep           # the table of docs/operations.md
    python -m bench.multiplex --cards-for 0.99  # the cards each policy needs, both traces

A trace of requests (popularity over the models, gamma inter-arrival times with a given
coefficient of variation: bursts) is played against each policy:

- pinned: one replica per model, the most popular first, never stopped; what does not fit on
  the cards is never served (its requests wait out the router's park timeout)
- cold: models scale to zero when idle and make room by stopping idle ones (a cold start)
- sleep: the same, with engines that sleep when idle and wake on a request; each engine takes
  the default share of a card (0.9), so a card holds one awake engine
- packed: sleep, with each model's `gpu_memory` set as a platform team sets it (CATALOGUE): a
  card holds every awake engine and sleeper whose memory fits
- dedicated: a card (or the cards its size needs) for every model the trace asks for, nothing
  ever stopped: the bound

Models have real sizes (CATALOGUE, from public model cards) and engines on one card share its
compute (bench/fleetsim.py: processor sharing, a pessimistic bound). Popularity is Zipf, or
Aegaeon-shaped (`--trace aegaeon`: a few hot models take ~98.5% of requests, as 94% of models
took 1.4% in Alibaba's production study, Aegaeon, SOSP'25).

The control plane is the real one; the processes around it are bench/fleetsim.py's models,
with the defaults of the real ones (the server's tick and heartbeat pacing, the router's
report period and park timeout), routes that take `--route-delay-s` to reach the router and
orders `--order-delay-s` to reach an agent. Every counter is taken inside the measured window
(after the warm-up, before the tail), and a request cut by a stop, a sleep or an unload, or
sent to an engine that cannot serve it, counts as failed. A virtual clock makes a 30-minute
trace take seconds, and gives the same figures on a busy machine.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from bench.fleetsim import PARK_TIMEOUT_S, TICK_S, Events, Request, Sim, Timing
from controlplane.state.fleet import Fleet
from controlplane.state.store import SqliteStore
from controlplane.tick.reconciler import Reconciler
from controlplane.vocabulary.idle import IdleTracker

CARD_MB = 81559  # H100-80GB, as NVML counts it
HOST_MB = 2 * 1024 * 1024  # a DGX-class node's 2 TiB
POLICIES = ("pinned", "cold", "sleep", "packed", "dedicated")
SLEEPING = ("sleep", "packed")
TRACES = ("zipf", "aegaeon")


@dataclass(frozen=True)
class Size:
    params: str  # as the model cards name them
    weights_gb: float  # at bf16, two bytes a parameter
    gpu_memory: str | None  # what a platform team sets: weights and KV cache (None: 0.9 of
    # the card, vLLM's default)
    gpus: int = 1

    @property
    def decode_tok_s(self) -> float:
        """One request's decode rate alone: each step reads every weight once from HBM, so
        HBM bandwidth over the weights each card holds, at the share of peak vLLM reaches."""
        return H100_HBM_GB_S * HBM_EFFICIENCY / (self.weights_gb / self.gpus)

    @property
    def prefill_tok_s(self) -> float:
        """Prompt tokens a second: 2 FLOPs a parameter a token, at a prefill's usual MFU."""
        params = self.weights_gb / 2 * 1e9
        return H100_BF16_TFLOPS * 1e12 * PREFILL_MFU * self.gpus / (2 * params)

    @property
    def move_factor(self) -> float:
        """Its sleep and wake, as a multiple of an 8B's: weights over the same host link."""
        return self.weights_gb / CATALOGUE_8B_WEIGHTS_GB


# Speeds from public figures: an H100 SXM's 3.35 TB/s of HBM3 and 989 TFLOPS dense bf16
# (NVIDIA's H100 datasheet); decode at ~60% of peak bandwidth and prefill at ~50% MFU, as
# vLLM's and MLPerf's H100 results for 8B-70B models show. An 8B then decodes a request at
# ~125 tokens/s alone and prefills ~31k tokens/s; a 32B ~31 and ~7.5k.
H100_HBM_GB_S = 3350.0
HBM_EFFICIENCY = 0.6
H100_BF16_TFLOPS = 989.0
PREFILL_MFU = 0.5
CATALOGUE_8B_WEIGHTS_GB = 16.1
# Request lengths: lognormal, with ShareGPT-like medians (prompt ~500 tokens, answer ~130),
# capped as a chat deployment caps them.
PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_MAX = 500, 1.0, 8192
OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_MAX = 130, 0.8, 2048


# From the public model cards (Hugging Face: Qwen2.5-1.5B/3B/7B/14B/32B-Instruct,
# Llama-3.1-8B/70B-Instruct), weights at bf16; `gpu_memory` adds KV cache for about 64k tokens
# of context at each size (an 8B's GQA cache is 128 KiB a token), which is how vLLM's
# --gpu-memory-utilization is set when engines share a card. A 32B fills an 80 GB card; a 70B
# takes two.
CATALOGUE = {
    "1.5b": Size("1.5B", 3.1, "10GB"),
    "3b": Size("3B", 6.2, "14GB"),
    "7b": Size("7B", 15.2, "24GB"),
    "8b": Size("8B", 16.1, "24GB"),
    "14b": Size("14B", 29.5, "40GB"),
    "32b": Size("32B", 65.5, None),
    "70b": Size("70B", 141.1, None, gpus=2),
}
# A platform's catalogue: mostly small models, a few large ones (the mix of 24).
MIX = ["1.5b"] * 4 + ["3b"] * 4 + ["7b"] * 5 + ["8b"] * 5 + ["14b"] * 4 + ["32b"] * 2


def model_speed(name: str) -> tuple[float, float, float]:
    """bench/fleetsim.py's Timing.model_speed: a model's speeds by its size."""
    size = size_of(name)
    return size.prefill_tok_s, size.decode_tok_s, size.move_factor


def size_of(name: str) -> Size:
    """A model's size: the mix, strided so that size and popularity are unrelated (m00, the
    most popular, is small; m10 a 32B); a name outside the models (a base) is an 8B."""
    if not (name.startswith("m") and name[1:].isdigit()):
        return CATALOGUE["8b"]
    return CATALOGUE[MIX[(int(name[1:]) * 7) % len(MIX)]]


@dataclass(frozen=True)
class Settings:
    models: int = 24
    cards: int = 8
    minutes: float = 30.0
    rate: float = 2.0  # requests a second, all models together: the hot ones under real load
    cv: float = 2.0  # of the inter-arrival times: 1 is Poisson, more is burstier
    zipf: float = 1.1
    trace: str = "zipf"  # or "aegaeon": `hot` models take `hot_share` of the requests
    hot: int = 3
    hot_share: float = 0.985
    cold_start_s: float = 60.0  # vLLM's, for a small model (vllm #20264)
    wake_s: float = 2.0  # level-1 wake, alone on the node's host link
    sleep_s: float = 1.0  # level-1 offload to host memory, alone on the link
    engine_ttft_s: float = 0.2
    service_s: float = 3.0  # a request's whole answer
    slots: int = 8  # requests an engine runs at once (its max_num_seqs); more queue
    # Moves (sleeps, wakes) a node's host carries at full speed at once; more share them. A
    # DGX H100's 8 GPUs sit in pairs behind 4 PCIe switches.
    host_links: int = 4
    adapter_load_s: float = 0.5
    route_delay_s: float = 0.1  # a published table to the router
    order_delay_s: float = 0.1  # a tick's order to the agent (its watch)
    slo_s: float = 5.0  # time to first token
    sleep_after_s: float = 30.0
    scale_to_zero_after_s: float = 600.0
    residency_s: float = 30.0  # min_residency for cold starts: half a cold start
    sleep_residency_s: float = 5.0  # for sleepers: a few wakes
    warmup_minutes: float = 15.0  # the same trace before the window, not measured
    seed: int = 7
    # Requests with lengths and models with speeds and wakes by their size (Size); False:
    # every request alike (`service_s`, `engine_ttft_s`) and every wake `wake_s`.
    sized: bool = True
    # gpuctl server --rebalance (controlplane/rules/rebalance.py): off, as it is by default.
    rebalance: bool = False

    def timing(self) -> Timing:
        return Timing(
            self.cold_start_s,
            self.wake_s,
            self.sleep_s,
            self.engine_ttft_s,
            self.service_s,
            self.slots,
            self.adapter_load_s,
            self.route_delay_s,
            self.order_delay_s,
            self.host_links,
            model_speed if self.sized else None,
        )

    @property
    def swap_bound_s(self) -> float:
        """The goal for a swapped request's p99 TTFT: 1.5 x wake + one tick + one order."""
        return 1.5 * self.wake_s + TICK_S + self.order_delay_s


def trace(s: Settings) -> list[tuple[float, str]]:
    """Arrivals over `s.minutes`: gamma inter-arrival times of mean 1/rate and CV `s.cv`, each
    request for a model drawn by Zipf popularity."""
    rng = random.Random(s.seed)
    names = model_names(s.models)
    weights = popularity(s)
    shape = 1 / (s.cv * s.cv)
    scale = (1 / s.rate) / shape
    out, at = [], 0.0
    while True:
        at += rng.gammavariate(shape, scale)
        if at >= s.minutes * 60:
            return out
        out.append((at, rng.choices(names, weights)[0]))


def lengths(s: Settings, count: int) -> list[tuple[int, int]]:
    """(prompt, output) tokens of `count` requests, from a generator of their own (the
    arrivals stay those of `trace`)."""
    rng = random.Random(s.seed * 7919 + 1)

    def draw(median: int, sigma: float, most: int) -> int:
        return max(1, min(most, round(rng.lognormvariate(math.log(median), sigma))))

    out = []
    for _ in range(count):
        prompt = draw(PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_MAX)
        out.append((prompt, draw(OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_MAX)))
    return out


def warmup_trace(s: Settings) -> list[tuple[float, str]]:
    """What comes before the window: the same popularity and burstiness (another stretch of
    the same trace), ending two minutes before the window so that the fleet settles."""
    minutes = max(0.0, s.warmup_minutes - 2)
    return trace(replace(s, minutes=minutes, seed=s.seed + 100_003)) if minutes else []


def popularity(s: Settings) -> list[float]:
    """Each model's share of the requests, the most popular first."""
    if s.trace == "aegaeon":
        hot = min(s.hot, s.models)
        tail = s.models - hot
        if not tail:
            return [1.0] * hot
        hot_weights = [1 / (rank + 1) for rank in range(hot)]
        scale = s.hot_share / sum(hot_weights)
        return [w * scale for w in hot_weights] + [(1 - s.hot_share) / tail] * tail
    if s.trace != "zipf":
        raise ValueError(f"trace: one of {', '.join(TRACES)}, got {s.trace!r}")
    return [1 / (rank + 1) ** s.zipf for rank in range(s.models)]


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
    size = size_of(name)
    if size.gpus > 1:
        body["gpus_per_replica"] = size.gpus
    if policy in ("cold", *SLEEPING):
        body |= {"min_replicas": 0, "scale_to_zero_after": s.scale_to_zero_after_s}
    if policy in SLEEPING:
        body["sleep"] = {"level": 1, "after": s.sleep_after_s, "wake_timeout": "10m"}
        body["min_residency"] = s.sleep_residency_s
    if policy == "packed" and size.gpu_memory is not None:
        body["gpu_memory"] = size.gpu_memory
    return body


@dataclass
class Result:
    policy: str
    cards: int
    requests: int
    within_slo: int
    ttft: list[float]
    swapped_ttft: list[float]  # of requests that found their model asleep
    refused: int
    failed: int  # sent to an engine that could not serve it
    cut: int  # cut by a stop, a sleep or an unload
    cold_starts: int
    wakes: int
    gpu_seconds_awake: float
    loads: int = 0  # adapter loads
    unloads: int = 0
    cold_ttft: list[float] = field(default_factory=list)  # of those that found it nowhere
    models: int = 0  # the models the trace asked for

    @property
    def attainment(self) -> float:
        return self.within_slo / self.requests if self.requests else 0.0

    @property
    def refused_share(self) -> float:
        return self.refused / self.requests if self.requests else 0.0

    def row(self) -> list[str]:
        return [
            self.policy,
            str(self.cards),
            str(self.requests),
            f"{100 * self.attainment:.1f}%",
            f"{percentile(self.ttft, 50):.2f}",
            f"{percentile(self.ttft, 99):.2f}",
            f"{percentile(self.swapped_ttft, 99):.2f}" if self.swapped_ttft else "-",
            f"{percentile(self.cold_ttft, 99):.2f}" if self.cold_ttft else "-",
            str(self.cold_starts),
            str(self.wakes),
            f"{self.gpu_seconds_awake / 3600:.1f}",
            str(self.refused),
            str(self.failed + self.cut),
        ]


HEADERS = [
    "policy", "cards", "requests", "within SLO", "p50 TTFT s", "p99 TTFT s",
    "p99 woken s", "p99 cold s", "cold starts", "wakes", "GPU-h awake", "refused",
    "failed or cut",
]  # fmt: skip


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.inf
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def cards_for(policy: str, s: Settings, arrivals) -> int:
    """Dedicated has the cards of every model the trace asks for; the others `s.cards`."""
    if policy != "dedicated":
        return s.cards
    return sum(size_of(model).gpus for model in {model for _, model in arrivals})


def run(
    policy: str,
    arrivals: list[tuple[float, str]],
    s: Settings,
    workdir: Path,
    bodies: list[dict] | None = None,
    warm: list[str] | None = None,
    cards: int | None = None,
    prepare=None,
) -> Result:
    """Play `arrivals` against a fleet of `cards` cards (default: the policy's) given `bodies`
    to apply (models and adapters; default: `s.models` models for `policy`, most popular
    first; dedicated: the models the trace asks for), on a store of its own under `workdir`.
    The warm-up is `warmup_trace` (`warm`: those models asked every 20 s instead).
    `prepare(sim)`: a last change to the modelled processes before the run (another policy's
    engines or router). The figures are the same for the same inputs: replica ids come from
    the seed, and nothing the run iterates is ordered by identity."""
    cards = cards if cards is not None else cards_for(policy, s, arrivals)
    names = model_names(s.models)
    asked = {model for _, model in arrivals}
    if bodies is None:
        wanted = [n for n in names if policy != "dedicated" or n in asked]
        bodies = [spec_for(n, policy, s) for n in wanted]
    events = Events()
    ids = random.Random(s.seed * 104_729 + cards)
    with tempfile.TemporaryDirectory(dir=workdir) as own:
        store = SqliteStore(Path(own) / f"{policy}-{s.seed}-{cards}.sqlite")
        try:
            fleet = Fleet(store, IdleTracker(live_window_s=10, clock=events), clock=events,
                          wall=events, ids=lambda: f"{ids.getrandbits(32):08x}")  # fmt: skip
            return _play(policy, arrivals, s, fleet, events, bodies, warm, cards, prepare)
        finally:
            store.close()


def _play(policy, arrivals, s: Settings, fleet, events, bodies, warm, cards, prepare) -> Result:
    reconciler = Reconciler(fleet, min_residency_s=s.residency_s, rebalance=s.rebalance)
    nodes = []
    for n in range(math.ceil(cards / 8)):
        name = f"node-{n}"
        gpus = [
            {"index": i, "uuid": f"{name}-{i}", "gpu_class": "H100-80GB", "memory_mb": CARD_MB}
            for i in range(min(8, cards - 8 * n))
        ]
        fleet.register({"name": name, "address": "127.0.0.1", "fabric": "f", "gpus": gpus,
                        "host_memory_mb": HOST_MB})  # fmt: skip
        nodes.append(name)
    for body in bodies:
        if body.get("kind") == "adapter":
            fleet.apply_adapter(body)
        else:
            fleet.apply(body)
    warmup = s.warmup_minutes * 60
    window = (warmup, warmup + s.minutes * 60)
    sim = Sim(fleet, reconciler, nodes, s.timing(), window, events)
    if prepare is not None:
        prepare(sim)
    if warm is None:
        applied = {body["name"] for body in bodies}
        asks = [Request(at, model) for at, model in warmup_trace(s) if model in applied]
    else:  # each asked every 20 s, so that what a policy keeps loaded is loaded at the start
        asks = [Request(float(at), name)
                for at in range(0, int(warmup) - 120, 20) for name in warm]  # fmt: skip
    played = [Request(at + warmup, model) for at, model in arrivals]
    for request, (prompt, output) in zip(asks + played, lengths(s, len(asks) + len(played)),
                                         strict=True):  # fmt: skip
        request.prompt_tokens, request.output_tokens = prompt, output
    sim.run(asks + played, window[1] + PARK_TIMEOUT_S + 60)
    served = [r for r in played if r.first_token >= 0 and not (r.failed or r.cut)]
    return Result(
        policy,
        cards,
        len(played),
        sum(r.ttft <= s.slo_s for r in served),
        [r.ttft for r in served],
        [r.ttft for r in served if r.parked and r.found == "asleep"],
        sum(r.refused for r in played),
        sum(r.failed for r in played),
        sum(r.cut for r in played),
        sim.counters["cold_starts"],
        sim.counters["wakes"],
        sim.gpu_seconds_awake,
        sim.counters["adapter_loads"],
        sim.counters["adapter_unloads"],
        [r.ttft for r in served if r.parked and r.found == "cold"],
        len({r.model for r in played}),
    )


def compare(s: Settings, policies=POLICIES) -> dict[str, Result]:
    arrivals = trace(s)
    with tempfile.TemporaryDirectory() as tmp:
        return {policy: run(policy, arrivals, s, Path(tmp)) for policy in policies}


def worst_of(s: Settings, seeds, policies=POLICIES) -> tuple[int, dict[str, Result]]:
    """Each seed's comparison; the one where sleep fares worst against dedicated."""
    runs = {seed: compare(replace(s, seed=seed), policies) for seed in seeds}

    def standing(results: dict[str, Result]) -> float:
        return results["sleep"].attainment / max(results["dedicated"].attainment, 1e-9)

    seed = min(runs, key=lambda k: standing(runs[k]))
    return seed, runs[seed]


def table(results: dict[str, Result]) -> str:
    return markdown_table([HEADERS] + [r.row() for r in results.values()])


def markdown_table(rows: list[list[str]]) -> str:
    """`rows` (headers first) as a Markdown table, for release notes."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]  # fmt: skip
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def verdict(s: Settings, results: dict[str, Result]) -> str:
    sleep, dedicated = results["sleep"], results["dedicated"]
    packed = results.get("packed")
    packing = (
        f"; packed {packed.attainment / max(dedicated.attainment, 1e-9):.2f}x dedicated"
        f" (goal 0.99), p99 swapped TTFT {percentile(packed.swapped_ttft, 99):.2f} s"
        if packed is not None
        else ""
    )
    best_other = max(results["pinned"].attainment, results["cold"].attainment)
    return (
        f"sleep {sleep.attainment / max(dedicated.attainment, 1e-9):.2f}x dedicated's SLO"
        f" attainment (goal 0.9) on {sleep.cards}/{dedicated.cards} of its cards,"
        f" {sleep.attainment / max(best_other, 1e-9):.2f}x the better of pinned and cold"
        f" (goal 1.2); refused {100 * sleep.refused_share:.2f}% (goal 1%), failed or cut"
        f" {sleep.failed + sleep.cut} (goal 0); p99 swapped TTFT"
        f" {percentile(sleep.swapped_ttft, 99):.2f} s (goal {s.swap_bound_s:.2f} s)" + packing
    )


def cards_needed(policy: str, s: Settings, arrivals, goal: float, workdir: Path,
                 bound: float) -> int | None:  # fmt: skip
    """The fewest cards on which `policy` serves `arrivals` with at least `goal` x `bound` of
    its requests within the SLO (bisection: attainment grows with cards), or None when even
    as many cards as dedicated has do not."""
    most = cards_for("dedicated", s, arrivals)
    least = max(size_of(name).gpus for name in model_names(s.models))

    def enough(cards: int) -> bool:
        return run(policy, arrivals, s, workdir, cards=cards).attainment >= goal * bound

    if not enough(most):
        return None
    while least < most:
        middle = (least + most) // 2
        if enough(middle):
            most = middle
        else:
            least = middle + 1
    return most


def buyers_table(s: Settings, goal: float, wakes=(0.5, 2.0, 6.0), policies=("sleep", "packed")):
    """Rows of the cards each policy needs for `goal` x dedicated's SLO attainment, for each
    trace and wake time, with the models a card that follows (the models the trace asks for
    over the cards); a row at a time."""
    for trace_name in TRACES:
        for wake_s in wakes:
            point = replace(s, trace=trace_name, wake_s=wake_s, sleep_s=wake_s / 2)
            arrivals = trace(point)
            with tempfile.TemporaryDirectory() as tmp:
                dedicated = run("dedicated", arrivals, point, Path(tmp))
                row = [trace_name, f"{wake_s:g}", f"{dedicated.cards}",
                       f"{100 * dedicated.attainment:.1f}%"]  # fmt: skip
                for policy in policies:
                    cards = cards_needed(policy, point, arrivals, goal, Path(tmp),
                                         dedicated.attainment)  # fmt: skip
                    row += (
                        [f">{dedicated.cards}", "-"]
                        if cards is None
                        else [str(cards), f"{dedicated.models / cards:.1f}"]  # models asked
                    )
            yield row


SWEEP_WAKE_S = (0.5, 1.0, 2.0, 4.0, 6.0)
SWEEP_COLD_S = (60.0, 120.0, 300.0)
SWEEP_HEADERS = ["wake s", "cold start s", "sleep", "cold", "pinned", "dedicated",
                 "sleep p99 swapped s", "goal s"]  # fmt: skip


def sweep(s: Settings, seeds):
    """SLO attainment of each policy over wake and cold-start times (worst seed of `seeds`),
    a row at a time."""
    for cold_s in SWEEP_COLD_S:
        for wake_s in SWEEP_WAKE_S:
            # The warm-up lasts long enough to cold-start every model a card at a time.
            settle_min = s.models / s.cards * cold_s / 60 + 5
            point = replace(s, wake_s=wake_s, sleep_s=wake_s / 2, cold_start_s=cold_s,
                            residency_s=cold_s / 2,
                            warmup_minutes=max(s.warmup_minutes, settle_min))  # fmt: skip
            _, results = worst_of(point, seeds)
            yield (
                [f"{wake_s:g}", f"{cold_s:g}"]
                + [
                    f"{100 * results[p].attainment:.1f}%"
                    for p in ("sleep", "cold", "pinned", "dedicated")
                ]  # fmt: skip
                + [
                    f"{percentile(results['sleep'].swapped_ttft, 99):.2f}",
                    f"{point.swap_bound_s:.2f}",
                ]  # fmt: skip
            )


def _yes(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"{text!r}: true or false")
    return text.lower() in ("true", "1", "yes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    for f in fields(Settings):
        if f.name not in ("cv", "seed"):
            value = getattr(defaults, f.name)
            kind = _yes if isinstance(value, bool) else type(value)  # bool("false") is True
            parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=value)
    parser.add_argument("--cv", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 8, 9])
    parser.add_argument("--sweep", action="store_true", help="the wake and cold-start table")
    parser.add_argument(
        "--cards-for",
        type=float,
        metavar="SHARE",
        help="the cards sleep and packed need for SHARE x dedicated's SLO attainment, on both"
        " traces at wakes of 0.5, 2 and 6 s (the first of --seeds)",
    )
    args = vars(parser.parse_args())
    seeds, cvs, sweeping = args.pop("seeds"), args.pop("cv"), args.pop("sweep")
    share = args.pop("cards_for")
    if share is not None:
        headers = ["trace", "wake s", "dedicated cards", "dedicated within SLO",
                   "sleep cards", "sleep models/card", "packed cards", "packed models/card"]
        rows = [headers]  # fmt: skip
        print(f"{args['models']} models, {args['minutes']:g} min; cards for {share:g} x"
              f" dedicated; each row takes a minute or more", flush=True)  # fmt: skip
        for row in buyers_table(Settings(**args, cv=cvs[len(cvs) // 2], seed=seeds[0]), share):
            rows.append(row)
            print(" | ".join(row), flush=True)
        print(markdown_table(rows))
        return
    if sweeping:
        rows = [SWEEP_HEADERS]
        for row in sweep(Settings(**args, cv=cvs[len(cvs) // 2]), seeds):
            rows.append(row)
            print(" | ".join(row), flush=True)  # progress: the whole takes minutes
        print(markdown_table(rows))
        return
    for cv in cvs:
        settings = Settings(**args, cv=cv)
        seed, results = worst_of(settings, seeds)
        print(
            f"\n{settings.models} models on {settings.cards} cards, {settings.minutes:g} min,"
            f" {settings.rate:g} req/s, CV {cv:g}, Zipf {settings.zipf:g}; cold start"
            f" {settings.cold_start_s:g} s, wake {settings.wake_s:g} s, SLO {settings.slo_s:g} s;"
            f" worst of seeds {seeds}: {seed}"
        )
        print(table(results))
        print(verdict(settings, results))


if __name__ == "__main__":
    main()

"""Several routers in front of the same engines: routing on each router's own counts against
routing on what the engines report (their queue and KV-cache use).

Three gpurouter processes (`--routers N`: N) in front of eight `gpuctl sim-engine` processes
that queue as vLLM does (`--max-num-seqs` running, the rest waiting in arrival order, prefill
time per uncached prompt token, a prefix cache), and one bursty trace of short and long prompts
over shared system prompts, sent the same for every policy, each request to the router the
trace names:

    a   today's: each router balances on its own requests in flight (--load-interval 0)
    b   engine-reported load: the engines' waiting + running, read every 100 ms (the default)
    c   b with prefix affinity (the default --affinity prefix)
    a+  a with prefix affinity: today's defaults, the prefix hit rate c must keep
    d   one router alone, on its own counts: the best a router can do without the engines

    python -m bench.multirouter [--seconds 60] [--policies a,b,c,a+,d] [--seeds 1,2,3]
        [--routers 3]

Per policy: mean and p99 time to first token (client side, streamed), the spread of the
engines' queues (sampled every 100 ms: the mean over samples of the longest queue minus the
shortest), the prefix-cache hit rate (cached / prompt tokens, from the engines' counters), and
requests lost (an error, or a stream cut short).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

from tests.harness import Processes, get, post

ROUTERS = 3
ENGINES = 8
# The engines: 4 sequences at once, 40 tokens/s each, 0.15 ms of prefill per uncached prompt
# token (a 2,000-token prompt: 0.3 s), a prefix cache of 64k tokens.
ENGINE_FLAGS = {
    "max_num_seqs": 4,
    "tokens_per_s": 40,
    "output_tokens": 400,
    "prefill_per_token": 0.00015,
    "cache_tokens": 65536,
    "kv_blocks": 8192,
}
POLICIES = {
    "a": ("--affinity=off", "--load-interval=0"),
    "b": ("--affinity=off",),
    "c": ("--affinity=prefix",),
    "a+": ("--affinity=prefix", "--load-interval=0"),
    "d": ("--affinity=off", "--load-interval=0"),
}
SYSTEMS = [
    f"System prompt {i}: you are assistant {i} of the fleet's support desk. " + "Rules. " * 400
    for i in range(8)
]


BURST_EVERY_S, BURST_S = 7.0, 2.0
BURST_RATE, QUIET_RATE = 60.0, 4.0
LONG_SHARE, LONG_CHARS, LONG_TOKENS = 0.15, 24000, 160


@dataclass(frozen=True)
class Request:
    at: float  # seconds from the start
    router: int
    system: int
    question: str
    max_tokens: int


def router_weights(routers: int) -> tuple[float, ...]:
    """Each router's share of the traffic: uneven, as behind a load balancer that pins
    clients (3: 50%, 30%, 20%; N: in proportion to 1, 1/2, 1/3 ...)."""
    if routers == 3:
        return (5, 3, 2)
    return tuple(1 / (i + 1) for i in range(routers))


def trace(seconds: float, seed: int, routers: int = ROUTERS) -> list[Request]:
    """Bursts of 3 s at 36 requests/s (more than the engines serve: queues build) between
    quiet spells of 4 s at 5/s; a quarter of the requests are long (a 2,000-token prompt and
    120 tokens out), the others short (a few hundred tokens in, 12 out). The routers get the
    traffic unevenly (`router_weights`)."""
    rng = random.Random(seed)
    weights = router_weights(routers)
    out, now = [], 0.0
    while now < seconds:
        burst = (now % BURST_EVERY_S) < BURST_S
        now += rng.expovariate(BURST_RATE if burst else QUIET_RATE)
        long = rng.random() < LONG_SHARE
        out.append(
            Request(
                at=now,
                router=rng.choices(range(routers), weights=weights)[0],
                system=rng.randrange(len(SYSTEMS)),
                question=f"question {len(out)} {'x' * (LONG_CHARS if long else 40)}",
                max_tokens=LONG_TOKENS if long else 12,
            )
        )
    return [r for r in out if r.at < seconds]


@dataclass
class Result:
    policy: str
    ttft: list[float] = field(default_factory=list)
    lost: int = 0
    spreads: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, other: Result) -> None:
        self.ttft += other.ttft
        self.lost += other.lost
        self.spreads += other.spreads
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens

    def row(self) -> dict:
        ordered = sorted(self.ttft)
        return {
            "policy": self.policy,
            "requests": len(self.ttft) + self.lost,
            "ttft_mean_ms": round(1000 * statistics.mean(ordered), 1) if ordered else None,
            "ttft_p99_ms": round(1000 * quantile(ordered, 0.99), 1) if ordered else None,
            "queue_spread": round(statistics.mean(self.spreads), 2) if self.spreads else None,
            "prefix_hit_rate": round(self.cached_tokens / self.prompt_tokens, 3)
            if self.prompt_tokens
            else None,
            "lost": self.lost,
        }


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def engine_series(engine: str, name: str) -> float:
    _, text = get(engine + "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def send(http, url: str, request: Request, result: Result) -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEMS[request.system]},
            {"role": "user", "content": request.question},
        ],
        "max_tokens": request.max_tokens,
        "stream": True,
    }
    began = time.monotonic()
    first = None
    tokens = 0
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                result.lost += 1
                return
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"content":"' in line:
                    if b'"content":""' not in line:
                        tokens += 1
                        if first is None:
                            first = time.monotonic() - began
    except (TimeoutError, aiohttp.ClientError):
        result.lost += 1
        return
    if first is None or tokens != request.max_tokens:
        result.lost += 1
        return
    result.ttft.append(first)


async def sample_queues(engines: list[str], result: Result, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            queues = []
            for engine in engines:
                async with http.get(engine + "/metrics") as resp:
                    text = await resp.text()
                line = next(
                    line
                    for line in text.splitlines()
                    if line.startswith("vllm:num_requests_waiting{")
                )
                queues.append(int(float(line.rsplit(" ", 1)[1])))
            result.spreads.append(max(queues) - min(queues))
            await asyncio.sleep(0.1)


async def replay(routers: list[str], engines: list[str], requests: list[Request], result: Result):
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    stop = asyncio.Event()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        sampler = asyncio.create_task(sample_queues(engines, result, stop))
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = []
        for request in requests:
            delay = start + request.at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            url = routers[request.router % len(routers)]
            sent.append(asyncio.create_task(send(http, url, request, result)))
        await asyncio.gather(*sent)
        stop.set()
        await sampler


def wait_idle(engines: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(
            engine_series(e, "vllm:num_requests_running") == 0
            and engine_series(e, "vllm:num_requests_waiting") == 0
            for e in engines
        ):
            return
        time.sleep(0.2)
    raise RuntimeError("the engines never went idle")


def run_policy(
    procs: Processes, engines: list[str], policy: str, requests, routers: int = ROUTERS
) -> Result:
    for engine in engines:
        post(engine + "/sim/cache/clear", b"{}")
    wait_idle(engines)
    backends = [f"--backend=m={e}" for e in engines]
    count = 1 if policy == "d" else routers
    started = [procs.router(*backends, *POLICIES[policy]) for _ in range(count)]
    urls = [url for url, _ in started]
    before = {
        e: (
            engine_series(e, "vllm:prefix_cache_queries_total"),
            engine_series(e, "vllm:prefix_cache_hits_total"),
        )
        for e in engines
    }
    result = Result(policy)
    asyncio.run(replay(urls, engines, requests, result))
    for engine in engines:
        result.prompt_tokens += (
            engine_series(engine, "vllm:prefix_cache_queries_total") - (before[engine][0])
        )
        result.cached_tokens += (
            engine_series(engine, "vllm:prefix_cache_hits_total") - (before[engine][1])
        )
    for _, proc in started:
        procs.terminate(proc)
    return result


def start_engines(procs: Processes) -> list[str]:
    return [procs.engine("m", **ENGINE_FLAGS) for _ in range(ENGINES)]


def compare(
    procs: Processes, seconds: float, policies: list[str], seeds: list[int], routers: int = ROUTERS
) -> list[dict]:
    """One row per policy, over the traces of every seed together (their requests pooled)."""
    engines = start_engines(procs)
    pooled = {policy: Result(policy) for policy in policies}
    for seed in seeds:
        requests = trace(seconds, seed, routers)
        for policy in policies:
            pooled[policy].add(run_policy(procs, engines, policy, requests, routers))
    return [pooled[policy].row() for policy in policies]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--policies", default="a,b,c,a+,d")
    parser.add_argument("--seeds", default="1", help="Traces to pool, e.g. 1,2,3.")
    parser.add_argument("--routers", type=int, default=ROUTERS, help="gpurouter processes")
    args = parser.parse_args()
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        procs = Processes(Path(folder))
        try:
            rows = compare(
                procs,
                args.seconds,
                args.policies.split(","),
                [int(s) for s in args.seeds.split(",")],
                args.routers,
            )
        finally:
            procs.stop_all()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()

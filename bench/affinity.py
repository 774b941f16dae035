"""Prefix and session affinity, measured: a multi-turn chat workload over replicas with a prefix
cache, through gpurouter with each `--affinity`, through an oracle that pins each session to
one replica, and through vllm-router's policies when it is installed. Same engines, same run.

    python -m bench.affinity [--sessions 200] [--turns 8] [--replicas 4] [--rate 40]

Per policy: prefix-cache hit rate (cached / prompt tokens, from the engines' usage), mean and
p99 time to first token, and max / mean requests in flight per replica (sampled).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.harness import Processes, free_port, post

SYSTEM = (
    "You are the support assistant of a GPU fleet. Answer briefly, cite the runbook section, "
    "never guess a node name, and ask for the replica id when the question needs one. "
) * 8  # a long shared system prompt, as real deployments have


@dataclass
class Result:
    policy: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    errors: int = 0
    load: list[list[int]] = field(default_factory=list)  # sampled running requests per replica

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def balance(self) -> float | None:
        """Time-averaged requests in flight of the busiest replica over that of the mean one."""
        if not self.load:
            return None
        means = [statistics.mean(col) for col in zip(*self.load, strict=True)]
        overall = statistics.mean(means)
        return round(max(means) / overall, 2) if overall else None

    def row(self) -> dict:
        return {
            "policy": self.policy,
            "hit_rate": round(self.hit_rate, 3),
            "ttft_mean_ms": round(1000 * statistics.mean(self.ttft), 1) if self.ttft else None,
            "ttft_p99_ms": round(1000 * quantile(self.ttft, 0.99), 1) if self.ttft else None,
            "max_over_mean_in_flight": self.balance(),
            "errors": self.errors,
        }


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def conversations(sessions: int, turns: int, seed: int = 7) -> list[list[str]]:
    rng = random.Random(seed)
    topics = ["eviction", "ECC errors", "a silent router", "placement", "drain", "XID 79"]
    return [
        [
            f"Session {s}, turn {t}: about {rng.choice(topics)}, {rng.random():.6f}?"
            for t in range(turns)
        ]
        for s in range(sessions)
    ]


async def run_workload(
    url: str,
    engines: list[str],
    policy: str,
    sessions,
    rate: float,
    pin: bool = False,
    send_session: bool = False,
) -> Result:
    """Sessions start with Poisson arrivals; each sends its turns one after the other, the
    history growing with every answer, as a chat client does. `send_session`: the client
    names its session (X-Session-Id), which the `session` policy needs."""
    result = Result(policy)
    rng = random.Random(11)
    stop = asyncio.Event()

    async def sample_load(http):
        while not stop.is_set():
            row = []
            for engine in engines:
                async with http.get(engine + "/metrics") as resp:
                    text = await resp.text()
                row.append(
                    int(
                        float(
                            next(
                                line.rsplit(" ", 1)[1]
                                for line in text.splitlines()
                                if line.startswith("vllm:num_requests_running{")
                            )
                        )
                    )
                )
            result.load.append(row)
            await asyncio.sleep(0.1)

    async def session(http, index, turns):
        messages = [{"role": "system", "content": SYSTEM}]
        base = engines[zlib.crc32(str(index).encode()) % len(engines)] if pin else url
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            body = {
                "model": "m",
                "messages": messages,
                "max_tokens": 8,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            started = time.perf_counter()
            first = None
            try:
                headers = {"X-Session-Id": f"session-{index}"} if send_session else {}
                async with http.post(
                    base + "/v1/chat/completions", json=body, headers=headers
                ) as resp:
                    if resp.status != 200:
                        result.errors += 1
                        return
                    answer = []
                    async for line in resp.content:
                        if not line.startswith(b"data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if first is None and chunk.get("choices"):
                            first = time.perf_counter() - started
                        for choice in chunk.get("choices", []):
                            answer.append(choice.get("delta", {}).get("content") or "")
                        usage = chunk.get("usage")
                        if usage:
                            result.prompt_tokens += usage["prompt_tokens"]
                            result.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
            except aiohttp.ClientError:
                result.errors += 1
                return
            result.ttft.append(first or 0.0)
            messages.append({"role": "assistant", "content": "".join(answer)})

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        sampler = asyncio.create_task(sample_load(http))
        tasks = []
        for index, turns in enumerate(sessions):
            tasks.append(asyncio.create_task(session(http, index, turns)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
        stop.set()
        await sampler
    return result


def clear_caches(engines: list[str]) -> None:
    for engine in engines:
        post(engine + "/sim/cache/clear", b"{}")


def compare(
    procs: Processes,
    sessions,
    replicas: int,
    rate: float,
    policies,
    cache_tokens: int,
    prefix_chars: int = 4096,
) -> list[dict]:
    engines = [
        procs.engine(
            "m", cache_tokens=cache_tokens, prefill_per_token=0.0002, ttft=0.01, tokens_per_s=400
        )
        for _ in range(replicas)
    ]
    rows = []
    for policy in policies:
        clear_caches(engines)
        if policy == "oracle":
            result = asyncio.run(run_workload("", engines, policy, sessions, rate, pin=True))
        elif policy.startswith("vllm-router"):
            result = vllm_router(procs, engines, policy, sessions, rate)
            if result is None:
                continue
        else:
            router, proc = procs.router(
                *(f"--backend=m={e}" for e in engines),
                "--affinity",
                policy,
                "--affinity-prefix-chars",
                str(prefix_chars),
            )
            result = asyncio.run(
                run_workload(
                    router,
                    engines,
                    f"gpurouter {policy}",
                    sessions,
                    rate,
                    send_session=policy == "session",
                )
            )
            procs.terminate(proc)
        rows.append(result.row())
    return rows


def vllm_router(procs, engines, policy, sessions, rate):
    binary = shutil.which("vllm-router")
    if binary is None:
        print(f"{policy}: vllm-router is not installed, left out", file=sys.stderr)
        return None
    port = free_port()
    kind = policy.split(" ", 1)[1]
    proc = procs.start(
        [
            binary,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            kind,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            "--worker-urls",
            *engines,
        ],
        port,
        name="vllm-router",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        return asyncio.run(run_workload(url, engines, policy, sessions, rate))
    finally:
        procs.terminate(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--rate", type=float, default=40.0, help="sessions started per second")
    parser.add_argument("--cache-tokens", type=int, default=40_000, help="per replica")
    parser.add_argument("--prefix-chars", type=int, default=4096)
    args = parser.parse_args()
    import tempfile

    procs = Processes(Path(tempfile.mkdtemp(prefix="affinity-")))
    try:
        rows = compare(
            procs,
            conversations(args.sessions, args.turns),
            args.replicas,
            args.rate,
            [
                "off",
                "session",
                "prefix",
                "oracle",
                "vllm-router cache_aware",
                "vllm-router round_robin",
            ],
            args.cache_tokens,
            args.prefix_chars,
        )
    finally:
        procs.stop_all()
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

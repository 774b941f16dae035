"""Tenants held to their limits and shares across routers, with real processes.

A `gpuctl server` (its defaults), gpurouter processes following it (three by default, each
with `--workers` processes on its port; their defaults, but `--max-in-flight 2`: a router
shares out a model's slots only where it knows their number), and
sim engines that run a bounded number of sequences at once. The bench plays the node agent
(it registers a node and heartbeats replicas Ready at the engines' URLs). Two models:

    chat   4 replicas, room to spare: where time to first token is measured
    busy   1 replica, 6 sequences at once: the one that is saturated

and three tenants, each with its own key, sent through the routers' HTTP like any client:

    A   weight 1
    B   weight 3
    C   requests_per_minute 600, sending ten times that, 80% of it through one router
    D   max_in_flight 32 and nothing else, holding 48 streams open spread over the routers
    E   tokens_per_minute 6,000, sending three times that, 80% of it through one router
    F   requests_per_minute 600 and max_in_flight 16, new to every router: one burst

The phases, one after the other on the same processes:
0. F's first burst, FIRST_BURST requests at once spread over the routers, none of which has
   seen F: under both its limits, so every one is answered (none refused).
1. A and B stream from `chat` at 15 requests/s each, spread over the routers: p99 TTFT alone.
2. The same with C's flood on `chat`: A's and B's p99 TTFT with C present, and C's admitted
   rate over the routers together, measured after the shares settled (`--warmup`).
   Meanwhile: how many route versions a second the control plane published (shares move
   with demand; more than a few a second is churn).
3. A and B each keep 6 requests per router on `busy`: completions A:B.
4. D's 48 streams on `slow`: the most of D's requests in flight at once, across the routers.
5. E's flood on `chat`: the tokens it was admitted (prompt and completion, as the engines'
   `usage` says), over the routers together, measured after the shares settled (`--warmup`),
   over twice the others' window: at sixteen routers a 10 s window of a steady flood reads
   93-102% of the limit, one request or two more or less at each bucket.

    python -m bench.tenants [--seconds 10] [--warmup 10] [--routers 3] [--workers 1]

16 routers on a machine of two cores: `--routers 4 --workers 4` (each worker is a router of
its own to the control plane, with its own share).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import aiohttp

from tests.harness import Processes, call, control_plane, wait_until

ROUTERS = 3
D_IN_FLIGHT, D_STREAMS = 32, 48
ROUTER_FLAGS = ("--max-in-flight", "2")
CHAT_REPLICAS, BUSY_REPLICAS, SLOW_REPLICAS = 4, 1, 8
CHAT_ENGINE = {"max_num_seqs": 8, "ttft": 0.02, "tokens_per_s": 400, "output_tokens": 8}
BUSY_ENGINE = {"max_num_seqs": 6, "ttft": 0.05, "tokens_per_s": 200, "output_tokens": 8}
# Streams long enough (2 s) that D's requests overlap; replicas enough that the routers'
# own slots (--max-in-flight 2 a replica) leave room for more than D's 32 at three routers.
SLOW_ENGINE = {"max_num_seqs": 8, "ttft": 0.05, "tokens_per_s": 20, "output_tokens": 40}
C_LIMIT = 600  # requests per minute
C_RATE = 100.0  # requests per second: ten times its limit
C_FIRST = 0.8  # of C's requests, through the first router; the rest spread over the others
AB_RATE = 15.0  # requests per second each, in phases 1 and 2
E_LIMIT = 6000  # tokens per minute
E_MAX_TOKENS = 40  # each request's bound; the sim engine generates 8
E_RATE = 30.0  # requests per second: about three times its limit in the tokens it uses
WAITING_PER_ROUTER = 6  # phase 3: requests each of A and B keeps at each router
TENANTS = {
    "a": {"name": "a", "weight": 1},
    "b": {"name": "b", "weight": 3},
    "c": {"name": "c", "requests_per_minute": C_LIMIT},
    "d": {"name": "d", "max_in_flight": D_IN_FLIGHT},
    "e": {"name": "e", "tokens_per_minute": E_LIMIT},
    "f": {"name": "f", "requests_per_minute": 600, "max_in_flight": 16},
}
FIRST_BURST = 16
ENGINES = {"chat": CHAT_ENGINE, "busy": BUSY_ENGINE, "slow": SLOW_ENGINE}
REPLICAS = {"chat": CHAT_REPLICAS, "busy": BUSY_REPLICAS, "slow": SLOW_REPLICAS}


@dataclass
class Setup:
    procs: Processes
    server: str
    routers: list[str]
    keys: dict[str, str]
    ready: dict = field(default_factory=dict)
    engines: list = field(default_factory=list)  # (model, url)
    stop: threading.Event = field(default_factory=threading.Event)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def start(procs: Processes, folder, routers: int = ROUTERS, workers: int = 1) -> Setup:
    server, _ = control_plane(procs, folder / "state.sqlite")
    node = {
        "name": "n1",
        "address": "127.0.0.1",
        "fabric": "ib-a",
        "gpus": [
            {"index": i, "uuid": f"GPU-n1-{i}", "gpu_class": "H100-80GB", "memory_mb": 81559}
            for i in range(16)
        ],
    }
    call("POST", server + "/v1/nodes", node)
    command = ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}"]
    for name, replicas in REPLICAS.items():
        spec = {"name": name, "gpu_class": "H100-80GB", "command": command}
        call("POST", server + "/v1/models", {**spec, "replicas": replicas})

    def assignments():
        return call("POST", server + "/v1/nodes/n1/heartbeat", {})[1]["assignments"]

    wait_until(lambda: len(assignments()) == sum(REPLICAS.values()), what="placement")
    ready, engines = {}, []
    for assigned in assignments():
        url = procs.engine(assigned["model"], **ENGINES[assigned["model"]])
        engines.append((assigned["model"], url))
        ready[assigned["replica"]] = {"state": "Ready", "url": url}
    keys = {}
    for name, body in TENANTS.items():
        call("POST", server + "/v1/tenants", body)
        keys[name] = call("POST", server + f"/v1/tenants/{name}/keys")[1]["key"]
    setup = Setup(procs, server, [], keys, ready, engines)
    threading.Thread(target=heartbeats, args=(setup,), daemon=True).start()
    for index in range(routers):
        url, _ = procs.router(
            "--control-plane", server, "--router-id", f"r{index}", "--workers", str(workers),
            *ROUTER_FLAGS,
        )  # fmt: skip
        setup.routers.append(url)
    for url in setup.routers:
        wait_until(lambda u=url: _serves(u, keys["a"]), what="the routes and keys")
    return setup


def heartbeats(setup: Setup) -> None:
    """The node agent's part: the replicas are Ready, every 2 s (the agent's default)."""
    while not setup.stop.is_set():
        call("POST", setup.server + "/v1/nodes/n1/heartbeat", {"replicas": setup.ready})
        setup.stop.wait(2.0)


def _serves(router: str, key: str) -> bool:
    body = json.dumps({"model": "chat", "messages": [], "max_tokens": 1}).encode()
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        router + "/v1/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Tally:
    ttft: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (at, seconds)
    answers: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # (at, status)
    tokens: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # (at, used)

    def in_window(self, tenant: str, began: float, ended: float, status: int = 200) -> int:
        return sum(
            1 for at, code in self.answers.get(tenant, ()) if began <= at < ended and code == status
        )

    def tokens_in(self, tenant: str, began: float, ended: float) -> int:
        return sum(used for at, used in self.tokens.get(tenant, ()) if began <= at < ended)

    def ttft_in(self, tenants, began: float, ended: float) -> list[float]:
        return [s for t in tenants for at, s in self.ttft.get(t, ()) if began <= at < ended]


async def send(http, router, key, tenant, model, stream, tally: Tally, max_tokens=8) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    body["max_tokens"] = max_tokens
    if stream:
        body["stream"] = True
    headers = {"Authorization": f"Bearer {key}"}
    began = time.monotonic()
    status = 0
    try:
        async with http.post(router + "/v1/chat/completions", json=body, headers=headers) as resp:
            status = resp.status
            if stream and status == 200:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        now = time.monotonic()
                        tally.ttft.setdefault(tenant, []).append((now, now - began))
                        break
            answer = await resp.read()
    except (TimeoutError, aiohttp.ClientError):
        status = -1
    now = time.monotonic()
    tally.answers.setdefault(tenant, []).append((now, status))
    if status == 200 and not stream:
        usage = json.loads(answer).get("usage") or {}
        used = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        tally.tokens.setdefault(tenant, []).append((now, used))


async def open_loop(
    http, routers, weights, key, tenant, model, stream, rate, until, tally, max_tokens=8
):
    """`rate` requests a second until `until`, each to a router drawn by `weights` in turn."""
    sent, order = [], []
    for index, weight in enumerate(weights):
        order += [index] * round(weight * 10)
    loop = asyncio.get_running_loop()
    start = loop.time()
    count = 0
    while time.monotonic() < until:
        router = routers[order[count % len(order)]]
        sending = send(http, router, key, tenant, model, stream, tally, max_tokens)
        sent.append(asyncio.create_task(sending))
        count += 1
        delay = start + count / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.gather(*sent)


async def closed_loop(http, router, key, tenant, model, until, tally) -> None:
    while time.monotonic() < until:
        await send(http, router, key, tenant, model, False, tally)


async def route_version(http, server: str) -> int:
    async with http.get(server + "/v1/routes") as resp:
        return (await resp.json())["version"]


async def running_on(http, engines: list[str]) -> int:
    """Sequences the engines run now, by their own metrics, read at once (not one instant:
    a stream that ends on one engine as the next starts on another may count twice)."""

    async def running(url: str) -> int:
        async with http.get(url + "/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith("vllm:num_requests_running"):
                    return int(float(line.rsplit(" ", 1)[1]))
        return 0

    return sum(await asyncio.gather(*(running(url) for url in engines)))


async def most_in_flight(http, engines: list[str], until: float) -> int:
    most = 0
    while time.monotonic() < until:
        most = max(most, await running_on(http, engines))
        await asyncio.sleep(0.05)
    return most


async def phases(setup: Setup, seconds: float, warmup: float, weights_s: float) -> dict:
    routers, keys = setup.routers, setup.keys
    even = (1.0,) * len(routers)
    c_split = (C_FIRST,) + ((1 - C_FIRST) / (len(routers) - 1),) * (len(routers) - 1)
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(60)
    ) as http:
        # 0: F's first burst, through routers new to it
        await asyncio.gather(
            *(
                send(http, routers[i % len(routers)], keys["f"], "f", "chat", False, tally)
                for i in range(FIRST_BURST)
            )
        )
        f_statuses = sorted(status for _, status in tally.answers.get("f", ()))
        # 1: A and B alone
        began = time.monotonic()
        until = began + seconds
        await asyncio.gather(
            *(
                open_loop(http, routers, even, keys[t], t, "chat", True, AB_RATE, until, tally)
                for t in ("a", "b")
            )
        )
        alone = tally.ttft_in(("a", "b"), began, until)
        # 2: with C's flood
        began = time.monotonic()
        settled = began + warmup
        until = settled + seconds
        versions_before = await route_version(http, setup.server)
        await asyncio.gather(
            open_loop(http, routers, c_split, keys["c"], "c", "chat", False, C_RATE, until, tally),
            *(
                open_loop(http, routers, even, keys[t], t, "chat", True, AB_RATE, until, tally)
                for t in ("a", "b")
            ),
        )
        versions = await route_version(http, setup.server) - versions_before
        async with http.get(setup.server + "/v1/routes") as resp:
            c_shares = (await resp.json())["tenants"]["tenants"]["c"]["shares"]
        flood_s = time.monotonic() - began
        with_c = tally.ttft_in(("a", "b"), settled, until)
        c_admitted = tally.in_window("c", settled, until)
        c_refused = tally.in_window("c", settled, until, 429)
        # 3: A and B keep `busy` saturated, each request on a connection of its own: the
        # kernel deals each to one of a router's workers, as it deals many clients'. Reused
        # connections would all go to the few workers the earlier phases opened them on, so
        # the figure would say which those were, not what 16 routers do.
        began = time.monotonic()
        settled = began + 2.0
        until = settled + weights_s
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(60),
        ) as fresh:
            await asyncio.gather(
                *(
                    closed_loop(fresh, router, keys[t], t, "busy", until, tally)
                    for t in ("a", "b")
                    for router in routers
                    for _ in range(WAITING_PER_ROUTER)
                )
            )
        completed = {t: tally.in_window(t, settled, until) for t in ("a", "b")}
        # 4: D's streams, more than its max_in_flight, spread over the routers
        began = time.monotonic()
        until = began + seconds
        slow = [e for model, e in setup.engines if model == "slow"]
        d_routers = [routers[i % len(routers)] for i in range(D_STREAMS)]
        _, d_most = await asyncio.gather(
            asyncio.gather(
                *(closed_loop(http, r, keys["d"], "d", "slow", until, tally) for r in d_routers)
            ),
            most_in_flight(http, slow, until),
        )
        # 5: E's token flood
        began = time.monotonic()
        settled = began + warmup
        until = settled + 2 * seconds
        await open_loop(http, routers, c_split, keys["e"], "e", "chat", False, E_RATE, until,
                        tally, E_MAX_TOKENS)  # fmt: skip
        e_tokens = tally.tokens_in("e", settled, until)
    lost = sum(
        1 for answers in tally.answers.values() for _, status in answers if status not in (200, 429)
    )
    return {
        "routers": len(routers),
        "route_versions_per_s": round(versions / flood_s, 2),
        "c_shares_per_min": {r: round(share[0], 1) for r, share in sorted(c_shares.items())},
        "d_max_in_flight": D_IN_FLIGHT,
        "d_most_in_flight": d_most,
        "seconds": seconds,
        "c_limit_per_min": C_LIMIT,
        "c_admitted_per_min": round(c_admitted * 60.0 / seconds, 1),
        "c_refused_per_min": round(c_refused * 60.0 / seconds, 1),
        "f_first_burst": f_statuses,
        "e_limit_tokens_per_min": E_LIMIT,
        "e_admitted_tokens_per_min": round(e_tokens * 60.0 / (2 * seconds), 1),
        "completed_a": completed["a"],
        "completed_b": completed["b"],
        "b_over_a": round(completed["b"] / max(1, completed["a"]), 3),
        "weights_seconds": weights_s,
        "ttft_p99_alone_ms": round(quantile(alone, 0.99) * 1000, 1),
        "ttft_p99_with_c_ms": round(quantile(with_c, 0.99) * 1000, 1),
        "ttft_samples": [len(alone), len(with_c)],
        "lost": lost,
    }


def measure(
    folder,
    seconds: float = 10.0,
    warmup: float = 10.0,
    routers: int = ROUTERS,
    workers: int = 1,
    weights_s: float | None = None,
) -> dict:
    """`weights_s`: phase 3's window (`seconds` unless given)."""
    procs = Processes(folder)
    setup = None
    try:
        setup = start(procs, folder, routers, workers)
        result = asyncio.run(phases(setup, seconds, warmup, weights_s or seconds))
        usage = call("GET", setup.server + "/v1/usage?since=1h")[1]["items"]
        table = call("GET", setup.server + "/v1/routes")[1]
        d_shares = table["tenants"]["tenants"]["d"]["shares"]
        result["d_in_flight_shares"] = {r: s[2] for r, s in sorted(d_shares.items())}
        result["usage_rows"] = len(usage)
        return result
    finally:
        if setup is not None:
            setup.stop.set()
        procs.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's window")
    parser.add_argument("--warmup", type=float, default=10.0, help="phase 2, before measuring")
    parser.add_argument("--routers", type=int, default=ROUTERS, help="router processes")
    parser.add_argument("--workers", type=int, default=1, help="each router's processes")
    parser.add_argument("--weights-seconds", type=float, help="phase 3's window (--seconds)")
    args = parser.parse_args()
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="gpufleet-tenants-") as folder:
        found = measure(
            Path(folder), args.seconds, args.warmup, args.routers, args.workers,
            args.weights_seconds,
        )  # fmt: skip
        print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()

"""Closed-loop load that takes turns between proxies, with each proxy's CPU per answer read
around every turn: two proxies compared slice by slice in one run, so that what else the
machine does at a moment weighs on both alike.

    python -m bench.alternating_load URL=PID URL=PID [--slices 40] [--slice-seconds 0.5]
        [--connections 32] [--body JSON] [--header "NAME: VALUE"]

Each slice sends to one proxy only, from its own keep-alive connections (the others wait
idle), until the slice ends; the answers still in flight are awaited before the slice is
closed. The proxy's CPU is the on-CPU time the kernel kept for its process group
(/proc/PID/task/*/schedstat, nanoseconds), read before and after. The order is ABBA... so that
a drift over the run weighs on both alike. Prints one JSON line: per slice the proxy's index,
its answers, errors and CPU nanoseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from bench.compare_routers import group_of
from bench.loadgen import build_request, read_answer


def on_cpu_ns(pids: list[int]) -> int:
    """On-CPU nanoseconds of every thread of `pids`."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended between the listing and the read
    return total


def turn_order(slices: int, contenders: int) -> list[int]:
    """ABBA ABBA... for two; round robin forwards then backwards for more."""
    forwards = list(range(contenders))
    order: list[int] = []
    while len(order) < slices:
        order += forwards if (len(order) // contenders) % 2 == 0 else forwards[::-1]
    return order[:slices]


class Target:
    def __init__(self, url: str, pid: int, body: bytes, headers: tuple[str, ...]) -> None:
        self.host, self.port, self.request = build_request(url, body, headers)
        self.pids = group_of(pid)
        self.streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def connect(self, connections: int) -> None:
        for _ in range(connections):
            self.streams.append(await asyncio.open_connection(self.host, self.port))

    async def slice(self, seconds: float) -> dict:
        counts = {"answers": 0, "errors": 0}
        before = on_cpu_ns(self.pids)
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(self.send(r, w, deadline, counts) for r, w in self.streams))
        counts["cpu_ns"] = on_cpu_ns(self.pids) - before
        return counts

    async def send(self, reader, writer, deadline: float, counts: dict) -> None:
        while time.perf_counter() < deadline:
            writer.write(self.request)
            status, _ = await read_answer(reader)
            counts["answers"] += 1
            counts["errors"] += status != 200

    def close(self) -> None:
        for _, writer in self.streams:
            writer.close()


async def run(targets: list[Target], slices: int, seconds: float, connections: int) -> list:
    for target in targets:
        await target.connect(connections)
    try:
        for target in targets:  # warm-up: first-call caches, the proxies' upstream pools
            await target.slice(seconds)
        results = []
        for index in turn_order(slices, len(targets)):
            results.append({"proxy": index, **await targets[index].slice(seconds)})
        return results
    finally:
        for target in targets:
            target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("proxies", nargs="+", metavar="URL=PID")
    parser.add_argument("--slices", type=int, default=40)
    parser.add_argument("--slice-seconds", type=float, default=0.5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--body", default='{"model": "m", "prompt": "hi", "max_tokens": 4}')
    parser.add_argument("--header", action="append", default=[], help="NAME: VALUE")
    args = parser.parse_args()
    targets = []
    for proxy in args.proxies:
        url, pid = proxy.rsplit("=", 1)
        targets.append(Target(url, int(pid), args.body.encode(), tuple(args.header)))
    import uvloop

    results = uvloop.run(run(targets, args.slices, args.slice_seconds, args.connections))
    print(json.dumps(results))


if __name__ == "__main__":
    main()

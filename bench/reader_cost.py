"""What reading the engines' load costs a router: one gpurouter process in front of 1,000
simulated replicas (10 models of 100, served by in-process sim engines in two helper processes,
as `replicas: in_process` serves them), every model sent to, so that every replica is read.
The router's CPU time (user + system, from /proc) over the same wall time, with the reader on
at `--load-interval` and off (two routers side by side), no requests meanwhile; the difference
is the reader's cost.

    python -m bench.reader_cost [--replicas 1000] [--interval 0.1] [--seconds 20] [--busy]
        [--histograms 40]

Idle engines (the default) come back the same each read, so after three reads they are read
ever less often, down to every 3 s (router/load/engineload.py); `--busy` moves every engine's
queue between reads, so every one is read every round: the reader's cost when nothing is quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from router.control.catalog import QUIET_AFTER as CATALOG_QUIET_AFTER
from router.server import RouterSettings
from tests.harness import Processes, get, post

MODELS = 10
QUIET_SETTLE_S = 6.0
# A router asks every replica's model list at its first QUIET_AFTER + 1 catalog refreshes, one
# every catalog_every_s, and few after (router/control/catalog.py): 1,000 asks in a window put
# 0.03-0.04 of a core into both routers and a hundredth of noise into their difference, which
# once read 0.032 for a reader that costs 0.042.
CATALOG_SETTLE_S = (CATALOG_QUIET_AFTER + 1) * RouterSettings.catalog_every_s + 1.0

HOST = """
import asyncio, random, sys
from sim.engine import EngineSettings, SimEngine
from sim.replicas import EngineHost

async def main(first, count, busy, histograms):
    host = EngineHost()
    for i in range(first, first + count):
        settings = EngineSettings([f"m{i % %(models)d}"], metrics_histograms=histograms)
        host.engines[f"r{i}"] = SimEngine(settings)
    await host.start()
    print(host.port, flush=True)
    while True:  # busy: every engine's queue moves (other routers' requests) between reads
        await asyncio.sleep(0.05 if busy else 3600)
        for engine in host.engines.values():
            engine.scheduler.running = random.randint(0, 8)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "busy", int(sys.argv[4])))
""".replace("%(models)d", str(MODELS))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_hosts(
    replicas: int, hosts: int = 2, busy: bool = False, histograms: int = 0
) -> tuple[list[subprocess.Popen], dict]:
    procs, urls = [], {}
    share = replicas // hosts
    for h in range(hosts):
        proc = subprocess.Popen(
            [sys.executable, "-c", HOST, str(h * share), str(share), "busy" if busy else "idle",
             str(histograms)],  # fmt: skip
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        port = int(proc.stdout.readline())
        for i in range(h * share, (h + 1) * share):
            urls[f"r{i}"] = f"http://127.0.0.1:{port}/replicas/r{i}"
    return procs, urls


def measure(procs: Processes, routes_file: str, interval: float, seconds: float) -> dict:
    """The router with its reader at `interval` and the same router with it off, side by side
    over the same span of their lives: what else a router does now and then (its model
    catalog's refreshes) falls in both alike, and the difference is the reader's."""
    started = time.monotonic()
    routers = {
        reads_at: procs.router("--routes", routes_file, f"--load-interval={reads_at}")
        for reads_at in (interval, 0)
    }
    for url, _ in routers.values():
        for m in range(MODELS):
            status, _, _ = post(
                url + "/v1/completions", f'{{"model": "m{m}", "prompt": "hi"}}'.encode()
            )
            assert status == 200
    # The first rounds open their connections; idle engines then come to be read every 3 s
    # within about 5 s (router/load/engineload.py), and the catalog's first refreshes are
    # over: the figure is the steady state's.
    time.sleep(2 * interval + 1 + QUIET_SETTLE_S)
    time.sleep(max(0.0, started + CATALOG_SETTLE_S - time.monotonic()))
    first = {at: reader_figures(url) for at, (url, _) in routers.items()}
    cpu0 = {at: cpu_seconds(proc.pid) for at, (_, proc) in routers.items()}
    wall0 = time.monotonic()
    time.sleep(seconds)
    cpu = {at: cpu_seconds(proc.pid) - cpu0[at] for at, (_, proc) in routers.items()}
    wall = time.monotonic() - wall0
    last = reader_figures(routers[interval][0])
    for _, proc in routers.values():
        procs.terminate(proc)
    before = first[interval]
    reads = {k: v - before["reads"].get(k, 0) for k, v in last["reads"].items()}
    return {
        "cpu_on": cpu[interval] / wall,
        "cpu_off": cpu[0] / wall,
        "reads": reads,
        "reads_per_s": sum(reads.values()) / wall,
        "own_code_share": (last["busy_s"] - before["busy_s"]) / wall,
    }


def reader_figures(url: str) -> dict:
    """The reader's counters on the router's /metrics: reads by outcome, its own code's time."""
    _, text = get(url + "/metrics")
    lines = text.decode().splitlines()
    reads = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("gpurouter_engine_load_reads_total{")
    }
    busy = [float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("gpurouter_engine_load_busy")]
    return {"reads": reads, "busy_s": busy[0] if busy else 0.0}


def run(
    replicas: int = 1000,
    interval: float = 0.1,
    seconds: float = 20.0,
    busy: bool = False,
    histograms: int = 0,
) -> dict:
    hosts, urls = start_hosts(replicas, busy=busy, histograms=histograms)
    try:
        with tempfile.TemporaryDirectory() as folder:
            routes = {
                f"m{m}": [
                    {"id": rid, "url": u} for rid, u in urls.items() if int(rid[1:]) % MODELS == m
                ]
                for m in range(MODELS)
            }
            routes_file = Path(folder) / "routes.yaml"
            routes_file.write_text(yaml.safe_dump(routes))
            procs = Processes(Path(folder))
            try:
                found = measure(procs, str(routes_file), interval, seconds)
            finally:
                procs.stop_all()
    finally:
        for host in hosts:
            host.terminate()
            host.wait()
    return {
        "replicas": replicas,
        "engines": "busy" if busy else "idle",
        "histograms_a_page": histograms,
        "interval_s": interval,
        "router_cpu_off": round(found["cpu_off"], 4),
        "router_cpu_on": round(found["cpu_on"], 4),
        "reader_cost_of_a_core": round(found["cpu_on"] - found["cpu_off"], 4),
        "reads_per_s_expected": round(replicas / interval),
        "reads_ok": found["reads"].get("ok", 0),
        "reads_per_s": round(found["reads_per_s"]),
        "reader_own_code_of_a_core": round(found["own_code_share"], 4),
        "reads": found["reads"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=0.1)  # gpurouter's default
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--busy",
        action="store_true",
        help="every engine's queue changes between reads (as other routers' requests move it), "
        "so that no engine is quiet and every one is read every round",
    )
    parser.add_argument(
        "--histograms",
        type=int,
        default=0,
        help="latency histograms on each engine's page besides its load (40: a page of about "
        "80 KB, as vLLM's)",
    )
    args = parser.parse_args()
    print(json.dumps(run(args.replicas, args.interval, args.seconds, args.busy, args.histograms)))


if __name__ == "__main__":
    main()

"""A whole simulated fleet of real processes, read by operators while its nodes heartbeat.

One `gpuctl server` with a token file and its defaults (heartbeats paced by the fleet's size,
controlplane/rules/pacing.py), as a platform team runs it: one `gpuctl agent
--simulate` for every node, each node registering with the agent token and heartbeating with
the credential it was given (replicas in process, so 10,000 of them fit on one machine); one
`gpurouter` with the router token that watches and reports on every replica. It times the
registration of the whole fleet (agent start to every node Ready); once all replicas serve,
it runs `gpuctl status` (viewer token) back to back, as an operator with `--watch` or a
dashboard would, and counts the heartbeats that failed meanwhile. Full size (16,000 nodes,
10,000 replicas):

    .venv/bin/python -m bench.fleet_scale 16000 2000
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from controlplane.rules.pacing import HeartbeatPacing
from tests.harness import BIN, Processes, call, control_plane, free_port, wait_until

FABRIC_NODES = 1000  # nodes a fabric, as in a large training cluster's pods
GPUS_PER_NODE = 8
REPLICAS_PER_NODE = 0.625  # 10,000 replicas on 16,000 nodes
REPLICAS_PER_MODEL = 10
PACING = HeartbeatPacing()  # the server's defaults: heartbeats paced by the fleet's size
STATUS_CALLS = 20
TOKENS = {"admin": "adm-bench", "viewer": "vwr-bench", "router": "rtr-bench", "agent": "agt-bench"}
SIM = ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}"]


@dataclass
class Figures:
    nodes: int
    replicas: int
    register_s: float  # the agent's start to every node Ready, each with its credential
    status_s: list[float]  # gpuctl status, end to end, each call
    first_page_s: float  # GET /v1/nodes?limit=500, the first page of `gpuctl nodes`
    nodes_command_s: float  # gpuctl nodes -o json, every page
    heartbeats_lost: int  # heartbeats that failed while status ran
    not_ready: int  # nodes NotReady after the reads
    stop_s: float  # SIGTERM to exit, under that load

    @property
    def status_median_s(self) -> float:
        return statistics.median(self.status_s)

    def line(self) -> str:
        return (
            f"{self.nodes:,} nodes / {self.replicas:,} replicas, tokens on: registered in"
            f" {self.register_s:.1f} s; gpuctl status"
            f" {1000 * self.status_median_s:.0f} ms median (max {1000 * max(self.status_s):.0f}),"
            f" nodes first page {1000 * self.first_page_s:.0f} ms, gpuctl nodes -o json"
            f" {1000 * self.nodes_command_s:.0f} ms; heartbeats lost {self.heartbeats_lost},"
            f" NotReady {self.not_ready}; SIGTERM to exit {self.stop_s:.1f} s"
        )


def fleet_file(nodes: int) -> dict:
    fabrics, rest = divmod(nodes, FABRIC_NODES)
    sizes = [FABRIC_NODES] * fabrics + ([rest] if rest else [])
    return {
        "fabrics": [
            {"name": f"f{i}", "nodes": n, "gpu_class": "H100-80GB", "gpus_per_node": GPUS_PER_NODE}
            for i, n in enumerate(sizes)
        ],
        "replicas": "in_process",
    }


def heartbeat_failures(agent: subprocess.Popen) -> int:
    return Path(agent.log_path).read_text(errors="replace").count("heartbeat failed")


def gpuctl(url: str, *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "gpuctl"), "--server", url, "--token", TOKENS["viewer"], *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    return elapsed, done.stdout


def run(nodes: int, work: Path, procs: Processes) -> Figures:
    replicas = int(nodes * REPLICAS_PER_NODE) // REPLICAS_PER_MODEL * REPLICAS_PER_MODEL
    token_file = work / "tokens.yaml"
    token_file.write_text(yaml.safe_dump(TOKENS))
    url, server = control_plane(procs, work / "state.sqlite", token_file)
    heartbeat_s = PACING.period(nodes)
    (work / "fleet.yaml").write_text(yaml.safe_dump(fleet_file(nodes)))
    registering = time.perf_counter()
    agent = procs.start(
        [
            "gpuctl", "agent", "--server", url, "--simulate", str(work / "fleet.yaml"),
            "--state-dir", str(work / "agent"), "--token-file", str(token_file),
        ],
        name="agent",
    )  # fmt: skip

    def summary() -> dict:
        time.sleep(0.5)  # polled, not hammered: the reads measured are gpuctl's below
        return call("GET", url + "/v1/summary", token=TOKENS["viewer"], timeout=30)[1]

    wait_until(lambda: summary()["nodes"]["ready"] == nodes, timeout=30 + nodes / 100, what="nodes")
    register_s = time.perf_counter() - registering
    for k in range(replicas // REPLICAS_PER_MODEL):
        model = {
            "name": f"model-{k:04d}",
            "gpu_class": "H100-80GB",
            "command": SIM,
            "replicas": REPLICAS_PER_MODEL,
        }
        assert call("POST", url + "/v1/models", model, token=TOKENS["admin"], timeout=30)[0] == 201
    wait_until(
        lambda: summary()["replicas"]["by_state"].get("Ready") == replicas,
        timeout=60 + 4 * heartbeat_s,
        what="every replica Ready",
    )
    router_port = free_port()
    procs.start(
        [
            "gpurouter", "--listen", f"127.0.0.1:{router_port}", "--control-plane", url,
            "--tick", "2", "--token-file", str(token_file),
        ],
        router_port,
        name="router",
    )  # fmt: skip
    wait_until(
        lambda: (s := summary())["routers"]["live"] == 1 and s["idle"]["unknown"] == 0,
        timeout=60,
        what="the router to report on every replica",
    )
    before = heartbeat_failures(agent)
    status_s = []
    for _ in range(STATUS_CALLS):
        elapsed, out = gpuctl(url, "status", "-o", "json")
        assert json.loads(out)["nodes"]["total"] == nodes
        status_s.append(elapsed)
    started = time.perf_counter()
    status, first = call("GET", url + "/v1/nodes?limit=500", token=TOKENS["viewer"])
    first_page_s = time.perf_counter() - started
    assert status == 200 and len(first["items"]) == min(500, nodes)
    nodes_command_s, out = gpuctl(url, "nodes", "-o", "json")
    assert len(json.loads(out)["items"]) == nodes
    # A beat in flight when the reads end is not lost yet: wait for one more round.
    time.sleep(heartbeat_s * 1.1)
    lost = heartbeat_failures(agent) - before
    not_ready = summary()["nodes"]["not_ready"]
    stopping = time.perf_counter()
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)
    stop_s = time.perf_counter() - stopping
    return Figures(
        nodes,
        replicas,
        register_s,
        status_s,
        first_page_s,
        nodes_command_s,
        lost,
        not_ready,
        stop_s,
    )


def measure(nodes: int, keep: Path | None = None) -> Figures:
    """`keep`: a folder to run in and leave, logs and state, for a look afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        procs = Processes(work)
        try:
            return run(nodes, work, procs)
        finally:
            procs.stop_all()


def growth(small: Figures, large: Figures) -> float:
    """How much faster than the fleet a status call grew: 1.0 is linear."""
    return (large.status_median_s / small.status_median_s) / (large.nodes / small.nodes)


if __name__ == "__main__":
    large_n, small_n = (int(a) for a in sys.argv[1:3])
    keep = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    small = measure(small_n, keep and keep / str(small_n))
    large = measure(large_n, keep and keep / str(large_n))
    print(small.line())
    print(large.line())
    print(f"status growth against linear: {growth(small, large):.2f}")
    print(re.sub(r"\s+", " ", json.dumps([small.__dict__, large.__dict__])))

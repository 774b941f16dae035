"""Usage at the control plane against the routers' own counters, across a leader kill -9 and
a router paused longer than the control plane keeps a silent router in its split.

Two `gpuctl server`s on one PostgreSQL (a lease of 3 s), a simulated agent, two replicas of a
model, two routers with a tenant's key sending through both all along:
1. the leader is killed with SIGKILL; a standby takes over;
2. one router is paused (SIGSTOP) for `--pause` seconds (35 by default: past the 30 s after
   which a silent router leaves the split), then resumed;
3. the traffic stops; once the routers have reported, `GET /v1/usage` is compared with the sum
   of the routers' `gpurouter_tenant_requests_total` and `gpurouter_tenant_tokens_total`.
A usage that took a router's lifetime as a delta (a new leader, a long silence) would count it
twice; one that lost a minute would count less.

    python -m bench.tenant_usage [--pause 35]
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import threading
import time
from pathlib import Path

from tests.controlplane.conftest import spec
from tests.harness import Processes, call, get, post, wait_until
from tests.postgres import PostgresServer
from tests.test_failover_end_to_end import Cluster

METRICS_TOKEN = "bench-metrics"
BODY = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 4}).encode()  # fmt: skip


class Sender:
    """Requests with the tenant's key, back to back, to whichever routers are not paused."""

    def __init__(self, routers: list[str], key: str) -> None:
        self.routers, self.key = routers, key
        self.paused: set[str] = set()
        self.sending = threading.Lock()  # held while a request is chosen and in flight
        self.statuses: list[int] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        n = 0
        while not self.done.is_set():
            with self.sending:
                live = [r for r in self.routers if r not in self.paused]
                router = live[n % len(live)]
                n += 1
                try:
                    status = post(router + "/v1/chat/completions", BODY, headers, 10)[0]
                except OSError:
                    status = -1
                self.statuses.append(status)
            time.sleep(0.02)

    def pause(self, router: str) -> None:
        """Send no more to `router`, and return once no request to it is in flight: a router
        stopped under a request would hold it past the client's timeout."""
        self.paused.add(router)
        with self.sending:
            pass

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)


def series_sum(text: str, name: str, tenant: str, kind: str | None = None) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") or f'tenant="{tenant}"' not in line:
            continue
        if kind and f'kind="{kind}"' not in line:
            continue
        total += float(line.rsplit(" ", 1)[1])
    return total


def routers_counted(routers: list[str], tenant: str) -> dict[str, float]:
    counted = {"requests": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0}
    for router in routers:
        text = get(router + "/metrics", {"Authorization": f"Bearer {METRICS_TOKEN}"})[1].decode()
        counted["requests"] += series_sum(text, "gpurouter_tenant_requests_total", tenant)
        for kind in ("prompt", "completion"):
            counted[f"{kind}_tokens"] += series_sum(
                text, "gpurouter_tenant_tokens_total", tenant, kind
            )
    return counted


def usage_counted(cluster: Cluster, tenant: str) -> dict[str, float]:
    url = cluster.url(cluster.leader_port())
    rows = call("GET", url + f"/v1/usage?since=1h&tenant={tenant}")[1]["items"]
    return {
        field: float(sum(row[field] for row in rows))
        for field in ("requests", "prompt_tokens", "completion_tokens")
    }


def measure(folder: Path, pause_s: float = 35.0) -> dict:
    procs = Processes(folder)
    database = PostgresServer()
    sender = None
    try:
        database.create_database("usage")
        cluster = Cluster(procs, folder, database.dsn_of("usage"), servers=2)
        leader = cluster.url(cluster.leader_port())
        call("POST", leader + "/v1/models", spec(name="llama", replicas=2))
        call("POST", leader + "/v1/tenants", {"name": "payer"})
        key = call("POST", leader + "/v1/tenants/payer/keys")[1]["key"]
        wait_until(lambda: len(cluster.replicas("Ready")) == 2, timeout=60, what="replicas")
        routers = []
        for name in ("edge-a", "edge-b"):
            url, proc = procs.router(
                "--control-plane", cluster.urls, "--tick", "0.3", "--router-id", name,
                "--metrics-token", METRICS_TOKEN,
            )  # fmt: skip
            routers.append((url, proc))
        urls = [url for url, _ in routers]
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        for url in urls:
            wait_until(
                lambda u=url: post(u + "/v1/chat/completions", BODY, headers)[0] == 200,
                what="the key at the router",
            )
        sender = Sender(urls, key)
        time.sleep(3.0)
        killed = cluster.leader_port()
        procs.terminate(cluster.servers[killed], signal.SIGKILL)
        cluster.leader_port(timeout=30, besides=killed)
        time.sleep(3.0)
        paused_url, paused = routers[1]
        sender.pause(paused_url)
        paused.send_signal(signal.SIGSTOP)
        time.sleep(pause_s)
        paused.send_signal(signal.SIGCONT)
        sender.paused.discard(paused_url)
        time.sleep(3.0)
        sender.stop()
        time.sleep(2.0)  # a report period or two: every router's last counts reach the leader
        by_routers = routers_counted(urls, "payer")
        deadline = time.monotonic() + 10.0  # a short count stays short: it is the figure
        by_usage = usage_counted(cluster, "payer")
        while by_usage["requests"] < by_routers["requests"] and time.monotonic() < deadline:
            time.sleep(0.5)
            by_usage = usage_counted(cluster, "payer")
        return {
            "pause_s": pause_s,
            "sent": len(sender.statuses),
            "statuses": sorted(set(sender.statuses)),
            "routers": by_routers,
            "usage": by_usage,
            "ratio": {
                field: round(by_usage[field] / by_routers[field], 4) if by_routers[field] else None
                for field in by_routers
            },
        }
    finally:
        if sender is not None:
            sender.stop()
        procs.stop_all()
        database.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause", type=float, default=35.0, help="seconds a router is paused")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufleet-usage-") as folder:
        print(json.dumps(measure(Path(folder), args.pause), indent=2))


if __name__ == "__main__":
    main()

"""A tenant held at its limits through a leader kill -9, at four routers.

Two `gpuctl server`s on one PostgreSQL (a lease of 3 s), a simulated agent, two replicas of
`slow` (its engines take a second to answer) and one of `fast`, four routers following the
control planes, and two tenants sent to through all four routers all along:

    held    max_in_flight 20, on `slow`: 40 clients (10 a router), each sending the next
            request as the last ends, so that 20 are in flight whenever the shares hold
    rated   requests_per_minute 600, on `fast`: three times that sent, spread over the routers

After `--before` seconds the leader is killed with SIGKILL; a standby takes over and the
traffic goes on `--after` seconds. Measured all along:
- the `held` requests the engines run (their own `vllm:num_requests_running`, summed, every
  0.1 s): the most at once, and the fewest on average over a second, before and after the
  kill (a sample taken as one request ends and the next is on its way to the engine counts
  neither: the second's mean is what the tenant holds);
- `rated`'s admitted requests in each 10 s window, per minute: the fewest and the most (a
  window may hold one request more or less than its share of the minute: 6 a minute).

    python -m bench.tenant_failover [--before 15] [--after 25]
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

from tests.controlplane.conftest import spec
from tests.harness import Processes, call, get, post, wait_until
from tests.postgres import PostgresServer
from tests.test_failover_end_to_end import Cluster

ROUTERS = 4
HELD_LIMIT, HELD_CLIENTS = 20, 40
RATED_LIMIT = 600  # requests a minute
RATED_SENT_PER_S = 3 * RATED_LIMIT / 60.0
WINDOW_S = 10.0
SETTLE_S = 8.0  # the shares settle before anything is counted
BODIES = {
    tenant: json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4}).encode()  # fmt: skip
    for tenant, model in (("held", "slow"), ("rated", "fast"))
}


class Traffic:
    """The clients of both tenants, and what they were answered, with when."""

    def __init__(self, routers: list[str], keys: dict[str, str]) -> None:
        self.routers, self.keys = routers, keys
        self.done = threading.Event()
        self.answers: list[tuple[float, str, int]] = []  # (when answered, tenant, status)
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(
                target=self.hold, args=(routers[i % len(routers)], i / HELD_CLIENTS), daemon=True
            )
            for i in range(HELD_CLIENTS)
        ]
        self.threads.append(threading.Thread(target=self.flood, daemon=True))
        for thread in self.threads:
            thread.start()

    def send(self, router: str, tenant: str) -> int:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}",
                   "Content-Type": "application/json"}  # fmt: skip
        try:
            status = post(router + "/v1/chat/completions", BODIES[tenant], headers, 15)[0]
        except OSError:
            status = -1
        with self.lock:
            self.answers.append((time.monotonic(), tenant, status))
        return status

    def hold(self, router: str, first_after_s: float) -> None:
        self.done.wait(first_after_s)  # clients that began at once would send in waves
        while not self.done.is_set():
            # A refusal (the share did not grow in time) is retried after a pause; an answer,
            # at once.
            if self.send(router, "held") != 200:
                self.done.wait(0.2)

    def flood(self) -> None:
        began, n = time.monotonic(), 0
        senders: list[threading.Thread] = []
        while not self.done.is_set():
            router = self.routers[n % len(self.routers)]
            sender = threading.Thread(target=self.send, args=(router, "rated"), daemon=True)
            sender.start()
            senders.append(sender)
            n += 1
            self.done.wait(max(0.0, began + n / RATED_SENT_PER_S - time.monotonic()))
        for sender in senders:
            sender.join(20)

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(30)


def running(engines: list[str]) -> int:
    total = 0
    for url in engines:
        text = get(url + "/metrics")[1].decode()
        for line in text.splitlines():
            if line.startswith("vllm:num_requests_running"):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def watch(engines: list[str], until: float, into: list[tuple[float, int]]) -> None:
    while time.monotonic() < until:
        into.append((time.monotonic(), running(engines)))
        time.sleep(0.1)


def admitted_per_minute(answers, began: float, ended: float) -> list[float]:
    """`rated`'s answers 200 in each whole WINDOW_S from `began` to `ended`, per minute."""
    windows = int((ended - began) // WINDOW_S)
    counts = [0] * windows
    for at, tenant, status in answers:
        index = int((at - began) // WINDOW_S)
        if tenant == "rated" and status == 200 and 0 <= index < windows:
            counts[index] += 1
    return [count * 60.0 / WINDOW_S for count in counts]


def measure(folder: Path, before_s: float = 15.0, after_s: float = 25.0) -> dict:
    procs = Processes(folder)
    database = PostgresServer()
    traffic = None
    try:
        database.create_database("failover")
        cluster = Cluster(procs, folder, database.dsn_of("failover"), servers=2)
        leader = cluster.url(cluster.leader_port())
        slow = spec(name="slow", replicas=2)
        slow["command"] = slow["command"] + ["--ttft", "1.0"]
        call("POST", leader + "/v1/models", slow)
        call("POST", leader + "/v1/models", spec(name="fast", replicas=1))
        keys = {}
        for tenant in ({"name": "held", "max_in_flight": HELD_LIMIT},
                       {"name": "rated", "requests_per_minute": RATED_LIMIT}):  # fmt: skip
            call("POST", leader + "/v1/tenants", tenant)
            keys[tenant["name"]] = call("POST", leader + f"/v1/tenants/{tenant['name']}/keys")[1][
                "key"
            ]
        wait_until(lambda: len(cluster.replicas("Ready")) == 3, timeout=60, what="replicas")
        engines = [r["url"] for r in cluster.replicas("Ready") if r["model"] == "slow"]
        routers = []
        for index in range(ROUTERS):
            url, _ = procs.router("--control-plane", cluster.urls, "--router-id", f"edge-{index}")
            routers.append(url)
        headers = {"Authorization": f"Bearer {keys['rated']}", "Content-Type": "application/json"}
        for url in routers:
            wait_until(
                lambda u=url: post(u + "/v1/chat/completions", BODIES["rated"], headers)[0] == 200,
                what="the keys at the router",
            )
        traffic = Traffic(routers, keys)
        time.sleep(SETTLE_S)
        began = time.monotonic()
        samples: list[tuple[float, int]] = []
        watcher = threading.Thread(
            target=watch, args=(engines, began + before_s + after_s, samples), daemon=True
        )
        watcher.start()
        time.sleep(before_s)
        killed = cluster.leader_port()
        killed_at = time.monotonic()
        procs.terminate(cluster.servers[killed], signal.SIGKILL)
        cluster.leader_port(timeout=30, besides=killed)
        took_over_s = time.monotonic() - killed_at
        watcher.join(before_s + after_s + 30)
        ended = time.monotonic()
        traffic.stop()
        answers = list(traffic.answers)
        rates = admitted_per_minute(answers, began, ended)
        held = [count for _, count in samples]
        by_second: dict[int, list[int]] = {}
        for at, count in samples:
            by_second.setdefault(int(at - began), []).append(count)
        means = {second: sum(c) / len(c) for second, c in sorted(by_second.items())}
        return {
            "routers": ROUTERS,
            "held_limit": HELD_LIMIT,
            "held_most": max(held),
            "held_fewest_sample": min(held),
            "held_fewest_second": round(min(means.values()), 2),
            "held_fewest_second_after_kill": round(
                min(m for second, m in means.items() if began + second >= killed_at - 1), 2
            ),
            "held_by_second": [round(m, 1) for m in means.values()],
            "samples": len(samples),
            "killed_in_second": int(killed_at - began),
            "rated_limit_per_min": RATED_LIMIT,
            "rated_admitted_per_min_by_window": rates,
            "rated_fewest_per_min": min(rates),
            "rated_most_per_min": max(rates),
            "took_over_s": round(took_over_s, 2),
            "statuses": sorted({status for _, _, status in answers}),
            "lost": sum(1 for _, _, status in answers if status not in (200, 429)),
        }
    finally:
        if traffic is not None:
            traffic.stop()
        procs.stop_all()
        database.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=float, default=15.0, help="seconds before the kill")
    parser.add_argument("--after", type=float, default=25.0, help="seconds after it")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpufleet-failover-") as folder:
        print(json.dumps(measure(Path(folder), args.before, args.after), indent=2))


if __name__ == "__main__":
    main()

"""The configuration a platform team runs, proven together with real processes: PostgreSQL,
two control planes with one token file and TLS, an agent whose nodes act with their own
credentials, two routers, a model that autoscales and takes room from another, streams running
throughout. Then a schedule of faults: kill -9 of the leader during writes, a leader frozen
past its lease, a router killed, a replica killed, an apply and a scale under load, the
database restarted. Checked all along: nothing acknowledged is lost, no stream is cut but by
its own replica's death, no request for a model whose replicas kept running is refused, no
replica in use is stopped, no node goes NotReady, no read by any role shows an `env` value."""

from __future__ import annotations

import json
import os
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import yaml
from click.testing import CliRunner

from cli.main import gpuctl
from cli.tls import make_certificates
from tests.controlplane.conftest import spec
from tests.harness import free_port, wait_until
from tests.postgres import PostgresServer

pytestmark = pytest.mark.integration
TOKENS = {"admin": "adm-prod", "viewer": "vwr-prod", "router": "rtr-prod", "agent": "agt-prod"}
SECRET = "hf_PRODUCTION_SECRET_7731"
LEASE_TTL_S = 3.0
FLEET = {"fabrics": [{"name": "ib-a", "nodes": 2, "gpu_class": "H100-80GB", "gpus_per_node": 2}]}


def engine(tokens_per_s: float, output_tokens: int) -> list[str]:
    return [
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}", "--ttft", "0.02",
        "--tokens-per-s", str(tokens_per_s), "--output-tokens", str(output_tokens),
    ]  # fmt: skip


STEADY = spec(
    name="steady", replicas=2, min_replicas=2, env={"HF_TOKEN": SECRET}, command=engine(100, 20)
)
SPARE = spec(name="spare", replicas=1, min_replicas=0, min_residency="0s", command=engine(0, 4))
AUTO = spec(
    name="auto",
    replicas=1,
    min_replicas=1,
    max_replicas=2,
    target_in_flight=2,
    scale_down_delay="60s",
    priority=1,
    command=engine(40, 40),
)


class Production:
    def __init__(self, procs, tmp, database: PostgresServer) -> None:
        self.procs, self.tmp, self.database = procs, tmp, database
        database.create_database("fleet")
        self.dsn = database.dsn_of("fleet")
        self.tls = make_certificates(tmp / "tls")
        self.context = ssl.create_default_context(cafile=str(self.tls.ca))
        self.token_file = tmp / "tokens.yaml"
        self.token_file.write_text(yaml.safe_dump(TOKENS))
        self.ports = [free_port(), free_port()]
        self.servers = {port: self.start_server(port) for port in self.ports}
        self.urls = ",".join(self.url(port) for port in self.ports)
        self.leader()
        fleet_file = tmp / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(FLEET))
        self.agent = procs.start(
            ["gpuctl", "agent", "--server", self.urls, "--simulate", str(fleet_file),
             "--state-dir", str(tmp / "agent"), "--heartbeat", "0.5",
             "--token-file", str(self.token_file), "--ca-file", str(self.tls.ca)],
            name="agent",
        )  # fmt: skip
        self.router_ports = [free_port(), free_port()]
        self.routers = {port: self.start_router(port) for port in self.router_ports}

    @staticmethod
    def url(port: int) -> str:
        return f"https://127.0.0.1:{port}"

    def start_server(self, port: int):
        return self.procs.start(
            ["gpuctl", "server", "--listen", f"127.0.0.1:{port}", "--state", self.dsn,
             "--advertise", self.url(port), "--token-file", str(self.token_file),
             "--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key),
             "--lease-ttl", str(LEASE_TTL_S), "--lease-renew", "0.5", "--tick", "0.2",
             "--node-timeout", "10", "--heartbeat", "0.5", "--router-live", "3",
             "--min-residency", "0s"],
            port,
            name="server",
        )  # fmt: skip

    def start_router(self, port: int):
        return self.procs.start(
            ["gpurouter", "--listen", f"127.0.0.1:{port}", "--control-plane", self.urls,
             "--token-file", str(self.token_file), "--ca-file", str(self.tls.ca),
             "--tick", "0.3"],
            port,
            name="router",
        )  # fmt: skip

    def router(self, n: int) -> str:
        return f"http://127.0.0.1:{self.router_ports[n]}"

    def call(self, method: str, url: str, body=None, token: str = TOKENS["viewer"]):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.context) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def leading(self, besides: int | None = None) -> int | None:
        found = []
        for port, proc in self.servers.items():
            if port == besides or proc.poll() is not None:
                continue
            try:
                if self.call("GET", self.url(port) + "/v1/leader")[0] == 200:
                    found.append(port)
            except OSError:
                pass
        return found[0] if len(found) == 1 else None

    def leader(self, besides: int | None = None, timeout: float = 20.0) -> int:
        return wait_until(lambda: self.leading(besides), timeout=timeout, what="one leader")

    def read(self, path: str, token: str = TOKENS["viewer"]) -> dict:
        status, body = self.call("GET", self.url(self.leader()) + path, token=token)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def gpuctl(self, *args: str):
        return CliRunner().invoke(
            gpuctl,
            ["--server", self.urls, "--token", TOKENS["admin"], "--ca-file", str(self.tls.ca),
             *args],
        )  # fmt: skip

    def apply(self, body: dict):
        path = self.tmp / f"{body['name']}.yaml"
        path.write_text(yaml.safe_dump(body))
        return self.gpuctl("apply", "-f", str(path))

    def ready(self, model: str) -> int:
        rows = self.read(f"/v1/replicas?model={model}")["items"]
        return sum(1 for r in rows if r["state"] == "Ready")

    def engine_pids(self, model: str) -> list[int]:
        records = self.tmp / "agent" / "nodes"
        found = []
        for path in records.glob("*/replicas/*.json"):
            run = json.loads(path.read_text())
            if run["model"] == model and run["exit_code"] is None:
                found.append(run["pid"])
        return found


class Streams:
    """`clients` streaming chat requests to `model` through `router`, back to back; a stream
    is whole when its last chunk has a finish reason and all its tokens came."""

    def __init__(self, router: str, model: str, clients: int, tokens: int) -> None:
        self.api = openai.OpenAI(
            base_url=router + "/v1",
            api_key="-",
            max_retries=0,
            timeout=60.0,
        )
        self.model, self.tokens = model, tokens
        self.stop = threading.Event()
        self.whole: list[float] = []
        self.broken: list[tuple[float, str]] = []
        self.pool = ThreadPoolExecutor(clients)
        self.futures = [self.pool.submit(self.client) for _ in range(clients)]

    def client(self) -> None:
        while not self.stop.is_set():
            try:
                chunks = list(
                    self.api.chat.completions.create(
                        model=self.model, messages=[], max_tokens=self.tokens, stream=True
                    )
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                if chunks[-1].choices[0].finish_reason and len(text.split()) == self.tokens:
                    self.whole.append(time.monotonic())
                else:
                    self.broken.append((time.monotonic(), f"cut after {len(text.split())}"))
            except openai.APIError as exc:
                self.broken.append((time.monotonic(), repr(exc)))
                time.sleep(0.05)

    def end(self) -> None:
        self.stop.set()
        for future in self.futures:
            future.result(timeout=90)
        self.pool.shutdown()


class Watch:
    """Samples the fleet's summary twice a second through whichever server leads: the most
    nodes NotReady it ever saw."""

    def __init__(self, fleet: Production) -> None:
        self.fleet, self.not_ready, self.samples = fleet, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for port in self.fleet.ports:
                try:
                    status, body = self.fleet.call("GET", self.fleet.url(port) + "/v1/summary")
                except OSError:
                    continue
                if status == 200:
                    nodes = json.loads(body)["nodes"]
                    self.not_ready = max(self.not_ready, nodes["not_ready"])
                    self.samples += 1
                    break

    def end(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def database():
    server = PostgresServer()
    yield server
    server.close()


def test_the_production_configuration_holds_through_a_schedule_of_faults(procs, tmp_path, database):
    fleet = Production(procs, tmp_path, database)
    for body in (STEADY, SPARE, AUTO):
        assert fleet.apply(body).exit_code == 0
    wait_until(
        lambda: fleet.ready("steady") == 2 and fleet.ready("spare") == 1 and fleet.ready("auto"),
        timeout=60,
        what="every model Ready",
    )
    wait_until(
        lambda: all(fleet.call("GET", fleet.router(n) + "/healthz")[0] == 200 for n in (0, 1)),
        what="both routers",
    )
    figures: dict[str, float | int | str] = {}
    steady = Streams(fleet.router(0), "steady", clients=2, tokens=20)
    watch = Watch(fleet)
    acknowledged: dict[str, int] = {}
    unsure: set[str] = set()

    def change(name: str, replicas: int) -> None:
        answer = fleet.apply(spec(name=name, gpu_class="B200-192GB", replicas=replicas))
        if answer.exit_code == 0:
            acknowledged[name] = replicas
            unsure.discard(name)
        else:
            unsure.add(name)

    try:
        # Load on `auto` scales it out; its second replica takes `spare`'s card.
        auto = Streams(fleet.router(0), "auto", clients=4, tokens=40)
        wait_until(lambda: fleet.ready("auto") == 2, timeout=60, what="auto scaled out to 2")
        wait_until(lambda: fleet.ready("spare") == 0, timeout=10, what="spare stopped for room")
        figures["scaled out, taking room"] = "yes"

        # 1. kill -9 of the leader during writes
        leader = fleet.leader()
        for n in range(30):
            if n == 10:
                fleet.procs.terminate(fleet.servers[leader], signal.SIGKILL)
                killed_at = time.monotonic()
            change(f"m{n % 12}", n % 3)
        new = fleet.leader(besides=leader, timeout=LEASE_TTL_S + 10)
        figures["kill -9: a standby led after (s)"] = round(time.monotonic() - killed_at, 2)
        fleet.servers[leader] = fleet.start_server(leader)  # back, as a standby

        # 2. the new leader frozen past its lease, while a change is made through the list
        fleet.servers[new].send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            other = fleet.leader(besides=new, timeout=LEASE_TTL_S + 10)
            figures["SIGSTOP: the other led after (s)"] = round(time.monotonic() - frozen_at, 2)
            change("during-freeze", 1)
            assert "during-freeze" in acknowledged, "a change is taken while the old one is frozen"
        finally:
            fleet.servers[new].send_signal(signal.SIGCONT)
        wait_until(lambda: fleet.leading() == other, what="the resumed one to stand by")

        # 3. a router killed, and started again under the same identity
        light = Streams(fleet.router(1), "steady", clients=1, tokens=20)
        time.sleep(1.0)
        fleet.procs.terminate(fleet.routers[fleet.router_ports[1]], signal.SIGKILL)
        light.end()
        fleet.routers[fleet.router_ports[1]] = fleet.start_router(fleet.router_ports[1])

        # 4. a replica of `auto` killed on purpose: only its own streams may break
        (victim, *_) = fleet.engine_pids("auto")
        auto_broken_before = len(auto.broken)
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: fleet.ready("auto") == 2, timeout=60, what="auto replaced its replica")
        figures["auto streams cut by the replica killed"] = len(auto.broken) - auto_broken_before

        # 5. an apply and a scale under load
        assert fleet.apply({**AUTO, "scale_down_delay": "90s"}).exit_code == 0
        time.sleep(2.0)
        assert fleet.ready("auto") == 2, "an edit kept what the load asked for"
        assert fleet.gpuctl("scale", "auto", "1").exit_code == 0  # the starting point

        # 6. the database restarted under the leader
        database.stop()
        time.sleep(2.0)
        database.start()
        fleet.leader(timeout=30)
        wait_until(lambda: (change("after-restart", 2), "after-restart" in acknowledged)[1],
                   timeout=30, what="writes taken again")  # fmt: skip
        time.sleep(2.0)
    finally:
        watch.end()
        steady.end()
        auto.end()

    # Checked all along, and after.
    models = {m["name"]: m for m in fleet.read("/v1/models")["items"]}
    for name, replicas in acknowledged.items():
        if name not in unsure:
            assert models[name]["replicas"] == replicas, (name, models.get(name))
    assert len(unsure) <= 2, f"only a change in flight at a kill may fail: {unsure}"
    assert steady.broken == [], "a stream on a model whose replicas kept running was cut"
    assert len(steady.whole) > 50
    assert figures["auto streams cut by the replica killed"] <= 4
    auto_cut_elsewhere = len(auto.broken) - figures["auto streams cut by the replica killed"]
    assert auto_cut_elsewhere == 0, f"auto streams cut but by the killed replica: {auto.broken}"
    assert watch.samples >= 10, "the summary was read all along"
    assert watch.not_ready == 0, "a failover made a node NotReady"
    reads = []
    for token in TOKENS.values():
        for path in ("/v1/models", "/v1/models/steady", "/v1/replicas", "/v1/nodes", "/v1/summary",
                     "/v1/routers", "/v1/routes"):  # fmt: skip
            reads.append(fleet.call("GET", fleet.url(fleet.leader()) + path, token=token)[1])
    assert SECRET not in "\n".join(reads), "a read showed an env value"
    figures["steady streams whole / cut"] = f"{len(steady.whole)} / {len(steady.broken)}"
    figures["auto streams whole"] = len(auto.whole)
    figures["changes acknowledged / unsure"] = f"{len(acknowledged)} / {len(unsure)}"
    figures["most nodes NotReady"] = f"{watch.not_ready} in {watch.samples} reads"
    print("production configuration: " + "; ".join(f"{k}: {v}" for k, v in figures.items()))

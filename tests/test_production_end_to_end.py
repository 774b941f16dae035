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

from cli import client
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
    command=engine(40, 200),  # a stream of 40 tokens takes 1 s; of 200, 5 s
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
             "--node-timeout", str(NODE_TIMEOUT_S), "--heartbeat", "0.5", "--router-live", "3",
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

    def engine_runs(self, model: str) -> list[dict]:
        """The agent's records of `model`'s running engines: replica id, pid and more."""
        records = self.tmp / "agent" / "nodes"
        found = []
        for path in records.glob("*/replicas/*.json"):
            run = json.loads(path.read_text())
            if run["model"] == model and run["exit_code"] is None:
                found.append(run)
        return found


class Streams:
    """`clients` streaming chat requests to `model` through `router`, back to back (or `pause`
    apart); a stream is whole when its last chunk has a finish reason and all its tokens came,
    cut when it began and broke, refused when it never began (an error answer, a timeout)."""

    def __init__(
        self,
        router: str,
        model: str,
        clients: int,
        tokens: int,
        pause: float = 0.0,
        timeout: float = 60.0,
    ) -> None:
        self.api = openai.OpenAI(
            base_url=router + "/v1",
            api_key="-",
            max_retries=0,
            timeout=timeout,
        )
        self.model, self.tokens, self.pause = model, tokens, pause
        self.stop = threading.Event()
        self.whole: list[float] = []
        self.broken: list[tuple[float, str]] = []  # began, then broke
        self.refused: list[tuple[float, str]] = []  # never began
        self.pool = ThreadPoolExecutor(clients)
        self.futures = [self.pool.submit(self.client) for _ in range(clients)]

    def client(self) -> None:
        while not self.stop.is_set():
            began = False
            try:
                chunks = []
                for chunk in self.api.chat.completions.create(
                    model=self.model, messages=[], max_tokens=self.tokens, stream=True
                ):
                    began = True
                    chunks.append(chunk)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                if chunks[-1].choices[0].finish_reason and len(text.split()) == self.tokens:
                    self.whole.append(time.monotonic())
                else:
                    self.broken.append((time.monotonic(), f"cut after {len(text.split())}"))
            except openai.APIError as exc:
                (self.broken if began else self.refused).append((time.monotonic(), repr(exc)))
                time.sleep(0.05)
            self.stop.wait(self.pause)

    def whole_within(self, window: tuple[float, float]) -> int:
        return sum(window[0] <= at <= window[1] for at in self.whole)

    def end(self) -> None:
        self.stop.set()
        for future in self.futures:
            future.result(timeout=90)
        self.pool.shutdown()


def one_change(fleet: Production, servers: str, name: str, replicas: int = 1) -> str:
    """A change through gpuctl's client; what its answer said."""
    body = spec(name=name, gpu_class="B200-192GB", replicas=replicas)
    try:
        client.request(servers, "POST", "/v1/models", body, token=TOKENS["admin"], timeout=10.0,
                       ca_file=str(fleet.tls.ca))  # fmt: skip
    except client.ApiError as exc:
        return exc.message
    return "made"


class Writes:
    """Changes made back to back (so that some are in flight at any moment) from `threads`
    threads through gpuctl's client, each thread
    to a spec of its own, each change a new replica count (a cycle of three, so that every
    change differs from what is stored whether or not the one before was made). Kept: changes
    acknowledged, and those whose outcome the answer left unknown (in flight at a fault)."""

    def __init__(self, fleet: Production, prefix: str, threads: int = 4) -> None:
        self.fleet, self.prefix = fleet, prefix
        self.acknowledged: dict[str, int] = {}
        self.unknown: dict[str, int] = {}
        self.not_made: list[str] = []
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(threads)
        self.futures = [self.pool.submit(self.writer, f"{prefix}{i}") for i in range(threads)]

    def writer(self, name: str) -> None:
        n = 0
        while not self.stop.is_set():
            body = spec(name=name, gpu_class="B200-192GB", replicas=n % 3)
            n += 1
            try:
                client.request(
                    self.fleet.urls,
                    "POST",
                    "/v1/models",
                    body,
                    token=TOKENS["admin"],
                    timeout=10.0,
                    ca_file=str(self.fleet.tls.ca),
                )
                self.acknowledged[name] = self.acknowledged.get(name, 0) + 1
            except client.ApiError as exc:
                if "503" in exc.message or "not made" in exc.message:
                    self.not_made.append(exc.message)
                else:  # 504 outcome_unknown, a reset, no answer: it may have been made
                    self.unknown[name] = self.unknown.get(name, 0) + 1

    def end(self) -> None:
        self.stop.set()
        for future in self.futures:
            future.result(timeout=90)
        self.pool.shutdown()

    def check(self, models: dict) -> None:
        """Every acknowledged change stored, each unknown one stored once or not at all:
        a spec's generation counts the changes made to it."""
        for name, acked in self.acknowledged.items():
            made = models[name]["generation"] - acked
            assert 0 <= made <= self.unknown.get(name, 0), (name, models[name], acked)


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


NODE_TIMEOUT_S = 10.0
PER_WINDOW = 3  # whole steady streams at least inside each fault's window


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
    windows: dict[str, tuple[float, float]] = {}
    steady = Streams(fleet.router(0), "steady", clients=2, tokens=20)
    # A trickle on `spare` until it makes way: a stream that begins on it after it was chosen,
    # before its route is withdrawn everywhere, must end whole (the safe stop waits for it).
    spare = Streams(fleet.router(1), "spare", clients=1, tokens=4, pause=0.2, timeout=5.0)
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

    running = [steady, spare]  # every load started, ended whatever happens

    def started(load):
        running.append(load)
        return load

    writes_at_kill = writes_at_outage = None
    try:
        # Load on `auto` scales it out; its second replica takes `spare`'s card.
        auto = started(Streams(fleet.router(0), "auto", clients=4, tokens=40))
        wait_until(lambda: fleet.ready("auto") == 2, timeout=60, what="auto scaled out to 2")
        wait_until(lambda: fleet.ready("spare") == 0, timeout=10, what="spare stopped for room")
        spare.end()
        figures["scaled out, taking room"] = "yes"

        # 1. kill -9 of the leader while changes are in flight from three clients
        leader = fleet.leader()
        writes_at_kill = started(Writes(fleet, "k"))
        time.sleep(1.0)
        # One change certainly in flight: the leader holds it whole and waits on the database
        # (a lock on its specs, taken here for less than its lock_timeout) when it is killed.
        lock = "BEGIN; LOCK TABLE specs; SELECT pg_sleep(1.2); COMMIT;"
        # Generation 1 stored first, so that the change caught (replicas 1) and the one after
        # it (replicas 2) each raise it: the caught one stored twice, or late, would show.
        assert one_change(fleet, fleet.urls, "caught", replicas=0) == "made"
        caught = ThreadPoolExecutor(2)
        locked = caught.submit(database.psql, lock, database="fleet")
        time.sleep(0.3)
        sent = caught.submit(one_change, fleet, fleet.url(leader), "caught")
        time.sleep(0.5)
        fleet.procs.terminate(fleet.servers[leader], signal.SIGKILL)
        killed_at = time.monotonic()
        new = fleet.leader(besides=leader, timeout=LEASE_TTL_S + 10)
        figures["kill -9: a standby led after (s)"] = round(time.monotonic() - killed_at, 2)
        after_caught = sent.result(timeout=30)
        wait_until(lambda: one_change(fleet, fleet.urls, "caught", replicas=2) == "made",
                   timeout=30, what="the change after the caught one")  # fmt: skip
        time.sleep(1.0)
        writes_at_kill.end()
        windows["kill -9"] = (killed_at, time.monotonic())
        fleet.servers[leader] = fleet.start_server(leader)  # back, as a standby

        # 2. the new leader frozen past its lease, while a change is made through the list
        fleet.servers[new].send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            other = fleet.leader(besides=new, timeout=LEASE_TTL_S + 10)
            figures["SIGSTOP: the other led after (s)"] = round(time.monotonic() - frozen_at, 2)
            change("during-freeze", 1)
            assert "during-freeze" in acknowledged, "a change is taken while the old one is frozen"
            time.sleep(1.0)
        finally:
            fleet.servers[new].send_signal(signal.SIGCONT)
        wait_until(lambda: fleet.leading() == other, what="the resumed one to stand by")
        windows["SIGSTOP"] = (frozen_at, time.monotonic())

        # 3. a router killed, started again under the same identity, and serving
        light = started(Streams(fleet.router(1), "steady", clients=1, tokens=20))
        time.sleep(1.0)
        router_killed_at = time.monotonic()
        fleet.procs.terminate(fleet.routers[fleet.router_ports[1]], signal.SIGKILL)
        light.end()
        fleet.routers[fleet.router_ports[1]] = fleet.start_router(fleet.router_ports[1])
        again = started(Streams(fleet.router(1), "steady", clients=1, tokens=20))
        wait_until(lambda: len(again.whole) >= PER_WINDOW, what="the restarted router serving")
        again.end()
        windows["router killed"] = (router_killed_at, time.monotonic())
        assert again.broken == [], again.broken

        # 4. a replica of `auto` killed on purpose: only its own streams may break, and a
        # replacement is Ready and serving
        runs = fleet.engine_runs("auto")
        victim = runs[0]
        auto_broken_before = len(auto.broken)
        replica_killed_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)

        def replaced() -> bool:
            rows = fleet.read("/v1/replicas?model=auto")["items"]
            ready = [r["id"] for r in rows if r["state"] == "Ready"]
            return len(ready) == 2 and victim["replica"] not in ready

        wait_until(replaced, timeout=60, what="auto's killed replica replaced")
        served = len(auto.whole)
        wait_until(lambda: len(auto.whole) >= served + 4, what="auto serving after")
        windows["replica killed"] = (replica_killed_at, time.monotonic())
        figures["auto streams cut by the replica killed"] = len(auto.broken) - auto_broken_before

        # 5. an apply under load, then a scale-in whose victim carries streams: the load is
        # lowered first so that the autoscaler (2 in flight a replica) keeps what was asked
        # (4 in flight a replica from here: the load's 2 long streams ask for one replica).
        applied_at = time.monotonic()
        edited = {**AUTO, "scale_down_delay": "90s", "target_in_flight": 4}
        assert fleet.apply(edited).exit_code == 0
        time.sleep(2.0)
        assert fleet.ready("auto") == 2, "an edit kept what the load asked for"
        auto.end()
        auto_cut = len(auto.broken) - figures["auto streams cut by the replica killed"]
        assert auto_cut == 0, f"auto streams cut but by the killed replica: {auto.broken}"
        long_auto = started(Streams(fleet.router(0), "auto", clients=2, tokens=200))
        time.sleep(1.0)  # a 5 s stream on each replica
        assert fleet.gpuctl("scale", "auto", "1").exit_code == 0

        def retiring_with_streams() -> bool:
            rows = fleet.read("/v1/replicas?model=auto")["items"]
            return any(r["state"] == "Retiring" and "request" in r["reason"] for r in rows)

        wait_until(retiring_with_streams, what="the scale-in's victim draining its streams")
        seen = []

        def drained() -> bool:
            rows = fleet.read("/v1/replicas?model=auto")["items"]
            seen.append([(r["state"], r["reason"]) for r in rows])
            return [r["state"] for r in rows if r["state"] != "Failed"] == ["Ready"]

        try:
            wait_until(drained, timeout=30, what="the victim stopped once drained")
        except AssertionError:
            raise AssertionError(f"{seen[-1]}; {fleet.read('/v1/models/auto')}") from None
        long_auto.end()
        assert long_auto.broken == [], f"a scale-in cut a stream: {long_auto.broken}"
        assert long_auto.refused == [], long_auto.refused
        windows["apply and scale-in"] = (applied_at, time.monotonic())

        # 6. the database down for longer than the node timeout, changes in flight
        writes_at_outage = started(Writes(fleet, "o"))
        time.sleep(1.0)
        database.stop()
        outage_at = time.monotonic()
        time.sleep(NODE_TIMEOUT_S + 2.0)
        database.start()
        fleet.leader(timeout=30)
        wait_until(lambda: (change("after-restart", 2), "after-restart" in acknowledged)[1],
                   timeout=30, what="writes taken again")  # fmt: skip
        time.sleep(2.0)
        writes_at_outage.end()
        windows["database outage"] = (outage_at, time.monotonic())
    finally:
        watch.end()
        for load in running:
            load.stop.set()
        for load in running:
            load.end()

    # Checked all along, and after.
    models = {m["name"]: m for m in fleet.read("/v1/models")["items"]}
    for name, replicas in acknowledged.items():
        if name not in unsure:
            assert models[name]["replicas"] == replicas, (name, models.get(name))
    assert len(unsure) <= 1, f"only a change in flight at a fault may fail: {unsure}"
    for writes in (writes_at_kill, writes_at_outage):
        writes.check(models)
    in_flight = sum(writes_at_kill.unknown.values()) + sum(writes_at_outage.unknown.values())
    locked.result(timeout=30)
    caught.shutdown()
    assert "may have been made" in after_caught, after_caught
    # 1 (replicas 0), then the caught change made once (2) or not at all, then replicas 2: a
    # caught change stored twice, or after the one that followed it, raises it further.
    assert models["caught"]["generation"] in (2, 3), models["caught"]
    assert models["caught"]["replicas"] == 2, "nothing older came after the change that followed"
    assert steady.broken == [], f"a stream of a model whose replicas ran was cut: {steady.broken}"
    assert steady.refused == [], f"a request of a model whose replicas ran: {steady.refused}"
    for fault, window in windows.items():
        assert steady.whole_within(window) >= PER_WINDOW, (fault, steady.whole_within(window))
    assert spare.broken == [], f"a stream on the model that made room was cut: {spare.broken}"
    assert figures["auto streams cut by the replica killed"] <= 4
    assert watch.samples >= 10, "the summary was read all along"
    assert watch.not_ready == 0, "a failover or a database outage made a node NotReady"
    reads = []
    paths = ("/v1/models", "/v1/models/steady", "/v1/replicas", "/v1/nodes", "/v1/summary",
             "/v1/routers", "/v1/routes")  # fmt: skip
    for role, token in TOKENS.items():
        for path in paths:
            status, body = fleet.call("GET", fleet.url(fleet.leader()) + path, token=token)
            # Tables for operators; routes for routers (and admins); nothing for an agent.
            allowed = role == "admin" or (path == "/v1/routes") == (role == "router")
            allowed = allowed and role != "agent"
            assert status == (200 if allowed else 403), (role, path, status, body)
            reads.append(body)
    assert SECRET not in "\n".join(reads), "a read showed an env value"
    assert "<redacted>" in fleet.call("GET", fleet.url(fleet.leader()) + "/v1/models/steady")[1]
    figures["steady streams whole / cut"] = f"{len(steady.whole)} / {len(steady.broken)}"
    figures["steady streams whole in each fault's window"] = str(
        {fault: steady.whole_within(w) for fault, w in windows.items()}
    )
    figures["auto streams whole"] = len(auto.whole)
    figures["changes acknowledged / unknown at a fault"] = (
        f"{sum(writes_at_kill.acknowledged.values()) + sum(writes_at_outage.acknowledged.values())}"
        f" / {in_flight}"
    )
    figures["most nodes NotReady"] = f"{watch.not_ready} in {watch.samples} reads"
    print("production configuration: " + "; ".join(f"{k}: {v}" for k, v in figures.items()))

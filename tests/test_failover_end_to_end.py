"""Several control planes on one PostgreSQL, with real processes: servers, a simulated agent, a
router and sim engines. The leader is killed, frozen, or loses its database; what was
acknowledged stays, a standby takes over within the lease, and the data plane never notices."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import yaml
from click.testing import CliRunner

from cli.main import gpuctl
from tests.controlplane.conftest import spec
from tests.harness import call, free_port, post, wait_until
from tests.postgres import PostgresServer

pytestmark = pytest.mark.integration
LEASE_TTL_S = 3.0
FLEET = {"fabrics": [{"name": "ib-a", "nodes": 2, "gpu_class": "H100-80GB", "gpus_per_node": 2}]}
CHAT = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]}).encode()


class Cluster:
    """`servers` control planes on `dsn`, and (with `agent`) a simulated fleet that follows
    whichever leads."""

    def __init__(self, procs, tmp_path, dsn: str, servers: int = 2, agent: bool = True):
        self.procs, self.tmp, self.dsn = procs, tmp_path, dsn
        self.ports = [free_port() for _ in range(servers)]
        self.servers = {port: self.start_server(port) for port in self.ports}
        self.urls = ",".join(self.url(port) for port in self.ports)
        self.leader_port()  # one leads before anything else starts
        if agent:
            fleet_file = tmp_path / "fleet.yaml"
            fleet_file.write_text(yaml.safe_dump(FLEET))
            self.agent_admin = free_port()
            self.agent = procs.start(
                ["gpuctl", "agent", "--server", self.urls, "--simulate", str(fleet_file),
                 "--state-dir", str(tmp_path / "agent"), "--heartbeat", "0.3",
                 "--sim-admin", f"127.0.0.1:{self.agent_admin}"],
                self.agent_admin,
                name="agent",
            )  # fmt: skip

    @staticmethod
    def url(port: int) -> str:
        return f"http://127.0.0.1:{port}"

    def start_server(self, port: int):
        return self.procs.start(
            ["gpuctl", "server", "--listen", f"127.0.0.1:{port}", "--state", self.dsn,
             "--lease-ttl", str(LEASE_TTL_S), "--lease-renew", "0.5", "--tick", "0.2",
             "--node-timeout", "6", "--heartbeat", "0.3", "--router-live", "2"],
            port,
            name="server",
        )  # fmt: skip

    def leading(self) -> list[int]:
        answers = []
        for port, proc in self.servers.items():
            if proc.poll() is None:
                try:
                    if call("GET", self.url(port) + "/v1/leader", timeout=2)[0] == 200:
                        answers.append(port)
                except OSError:
                    pass
        return answers

    def leader_port(self, timeout: float = 20.0, besides: int | None = None) -> int:
        def one():
            leaders = [p for p in self.leading() if p != besides]
            return leaders[0] if len(leaders) == 1 else None

        return wait_until(one, timeout=timeout, what="one leader")

    def gpuctl(self, *args: str):
        return CliRunner().invoke(gpuctl, ["--server", self.urls, *args])

    def replicas(self, state=None) -> list[dict]:
        status, body = call("GET", self.url(self.leader_port()) + "/v1/replicas")
        assert status == 200, body
        return [r for r in body["items"] if state is None or r["state"] == state]

    def engine_pids(self) -> set[int]:
        records = self.tmp / "agent" / "nodes"
        return {json.loads(p.read_text())["pid"] for p in records.glob("*/replicas/*.json")}

    def lease_row(self, server: PostgresServer) -> dict:
        epoch, won_at = (
            server.psql(
                "SELECT epoch || '|' || extract(epoch from won_at) FROM leader_lease",
                database=self.dsn.rsplit("/", 1)[1],
            )
            .strip()
            .split("|")
        )
        return {"epoch": int(epoch), "won_at": float(won_at)}

    def last_write_of(self, server: PostgresServer, epoch: int) -> float | None:
        answer = server.psql(
            f"SELECT extract(epoch from last_at) FROM leader_writes WHERE epoch = {epoch}",
            database=self.dsn.rsplit("/", 1)[1],
        ).strip()
        return float(answer) if answer else None


def unplaceable(name: str, replicas: int) -> dict:
    """A model no card of this fleet can hold: its spec is stored, nothing is started."""
    return spec(name=name, gpu_class="B200-192GB", replicas=replicas)


class Traffic:
    """Requests through the router, back to back, until stopped; every status is kept.
    `spread`: each with a prompt of its own, so that prompt affinity sends them to every
    replica rather than to one."""

    def __init__(self, router: str, spread: bool = False) -> None:
        self.router, self.statuses, self.done = router, [], threading.Event()
        self.spread = spread
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        n = 0
        while not self.done.is_set():
            body = CHAT
            if self.spread:
                n += 1
                body = json.dumps(
                    {"model": "llama", "messages": [{"role": "user", "content": f"{n} hi"}]}
                ).encode()
            self.statuses.append(post(self.router + "/v1/chat/completions", body, timeout=20)[0])
            time.sleep(0.02)

    def stop(self) -> list[int]:
        self.done.set()
        self.thread.join(30)
        return self.statuses


def serving_cluster(procs, tmp_path, dsn, servers=2):
    cluster = Cluster(procs, tmp_path, dsn, servers)
    assert call(
        "POST", cluster.url(cluster.leader_port()) + "/v1/models", spec(name="llama", replicas=2)
    )[0] in (200, 201)
    wait_until(lambda: len(cluster.replicas("Ready")) == 2, timeout=30, what="two Ready replicas")
    router, _ = procs.router("--control-plane", cluster.urls, "--tick", "0.3")
    wait_until(lambda: post(router + "/v1/chat/completions", CHAT)[0] == 200, what="a route")
    return cluster, router


def test_kill_9_of_the_leader_during_200_changes_loses_none_acknowledged(
    procs, tmp_path, postgres_dsn
):
    cluster, router = serving_cluster(procs, tmp_path, postgres_dsn, servers=3)
    pids = cluster.engine_pids()
    assert len(pids) == 2
    traffic = Traffic(router)
    expected: dict[str, int | None] = {}  # model -> replicas (None: deleted)
    unsure: set[str] = set()  # a change that failed may or may not have been made
    result: list[float] = []  # seconds from the kill until a standby led
    for n in range(200):
        name = f"m{n % 40}"
        if n == 60:
            leader = cluster.leader_port()
            procs.terminate(cluster.servers[leader], signal.SIGKILL)
            threading.Thread(
                target=took_over, args=(cluster, leader, time.monotonic(), result), daemon=True
            ).start()
        kind = ("apply", "scale", "delete")[n // 40 % 3] if name in expected else "apply"
        if kind == "delete" and expected.get(name) is None:
            kind = "apply"
        if kind == "apply":
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(unplaceable(name, n % 3)))
            answer = cluster.gpuctl("apply", "-f", str(path))
            outcome = n % 3
        elif kind == "scale":
            answer = cluster.gpuctl("scale", name, str((n + 1) % 3))
            outcome = (n + 1) % 3
        else:
            answer = cluster.gpuctl("delete", name)
            outcome = None
        if answer.exit_code == 0:
            expected[name] = outcome
            unsure.discard(name)
        else:
            unsure.add(name)
    statuses = traffic.stop()
    took_over_in = result[0] if result else None

    assert took_over_in is not None and took_over_in <= LEASE_TTL_S + 2.0, took_over_in
    assert len(unsure) <= 2, f"only a change in flight at the kill may fail: {unsure}"
    leader = cluster.url(cluster.leader_port())
    models = {m["name"]: m for m in call("GET", leader + "/v1/models")[1]["items"]}
    for name, replicas in expected.items():
        if name in unsure:
            continue
        if replicas is None:
            assert name not in models, f"{name} was deleted, and acknowledged"
        else:
            assert models[name]["replicas"] == replicas, (name, models.get(name))
    assert set(statuses) == {200}, f"the router answered every request: {sorted(set(statuses))}"
    assert len(statuses) > 50
    assert cluster.engine_pids() == pids, "no engine was restarted"
    assert len(cluster.replicas("Ready")) == 2
    print(
        f"failover: a standby led {took_over_in:.2f} s after the kill; {len(statuses)} requests;"
        f" {len(expected)} models changed, {len(unsure)} left unsure"
    )


def took_over(cluster: Cluster, old: int, since: float, result: list) -> None:
    cluster.leader_port(timeout=30, besides=old)
    result.append(time.monotonic() - since)


def test_after_a_failover_nothing_in_use_looks_idle_and_a_silent_router_stays_silent(
    procs, tmp_path, postgres_dsn
):
    cluster, router = serving_cluster(procs, tmp_path, postgres_dsn)
    _, quiet = procs.router(
        "--control-plane", cluster.urls, "--tick", "0.3", "--router-id", "quiet"
    )
    leader = cluster.leader_port()
    wait_until(lambda: routers(cluster.url(leader)).get("quiet") == "live", what="quiet reports")
    quiet.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: routers(cluster.url(leader)).get("quiet") == "silent", what="silence")
        traffic = Traffic(router, spread=True)
        time.sleep(1.0)
        procs.terminate(cluster.servers[leader], signal.SIGKILL)
        new = cluster.url(cluster.leader_port(besides=leader))
        time.sleep(1.0)
        assert routers(new).get("quiet") == "silent", "a router silent before is silent after"
        # Once every router reports to the new leader nothing is unknown any more: what the
        # live router uses right now must read as used moments ago, not idle.
        quiet.send_signal(signal.SIGCONT)
        wait_until(
            lambda: set(routers(new).values()) == {"live"}, what="both routers live on the new one"
        )
        wait_until(
            lambda: all(r["idle_state"] == "exact" for r in cluster.replicas()),
            what="every replica's use known",
        )
        idle = call("GET", new + "/v1/summary?idle_after=2s")[1]["idle"]["replicas"]
        assert not [r for r in idle if r["model"] == "llama"], idle
        for row in cluster.replicas():
            assert row["idle_state"] == "exact" and row["idle_s"] < 3.0, row
        assert set(traffic.stop()) == {200}
    finally:
        quiet.send_signal(signal.SIGCONT)


def routers(url: str) -> dict[str, str]:
    return {r["id"]: r["state"] for r in call("GET", url + "/v1/routers")[1]["items"]}


def test_a_leader_frozen_past_its_lease_is_replaced_and_once_resumed_writes_nothing(
    procs, tmp_path, postgres_dsn, postgres_server
):
    cluster = Cluster(procs, tmp_path, postgres_dsn, servers=2, agent=False)
    old = cluster.leader_port()
    old_epoch = cluster.lease_row(postgres_server)["epoch"]
    assert call("POST", cluster.url(old) + "/v1/models", unplaceable("before", 1))[0] == 201
    cluster.servers[old].send_signal(signal.SIGSTOP)
    frozen_answer: list = []
    try:
        # A call the frozen leader's kernel accepts now, and that it reads once it runs again.
        late = threading.Thread(
            target=lambda: frozen_answer.append(
                call("POST", cluster.url(old) + "/v1/models", unplaceable("late", 1), timeout=30)
            )
        )
        late.start()
        new = cluster.leader_port(timeout=LEASE_TTL_S + 5, besides=old)
        lease = cluster.lease_row(postgres_server)
        assert lease["epoch"] == old_epoch + 1
        assert call("POST", cluster.url(new) + "/v1/models", unplaceable("after", 1))[0] == 201
    finally:
        cluster.servers[old].send_signal(signal.SIGCONT)
    late.join(30)
    status, body = frozen_answer[0]
    assert status in (307, 503), f"the deposed leader did not act on it: {status} {body}"
    wait_until(lambda: cluster.leading() == [new], what="the old leader to step down")
    time.sleep(1.0)  # its reconcile loop and writer had every chance to write
    last = cluster.last_write_of(postgres_server, old_epoch)
    assert last is not None and last < lease["won_at"], "no write of its epoch after the takeover"
    leader = call("GET", cluster.url(old) + "/v1/leader")[1]
    assert leader["leader"] is False and leader["url"] == cluster.url(new)
    names = {m["name"] for m in call("GET", cluster.url(new) + "/v1/models")[1]["items"]}
    assert "before" in names and "after" in names and "late" not in names


def test_postgresql_restarted_under_the_leader_refuses_writes_then_resumes(procs, tmp_path):
    database = PostgresServer()
    try:
        cluster = Cluster(procs, tmp_path, database.dsn, servers=2, agent=False)
        leader = cluster.url(cluster.leader_port())
        assert call("POST", leader + "/v1/models", unplaceable("kept", 1))[0] == 201
        database.stop()
        refused = []
        for n in range(5):
            status, body = call("POST", leader + "/v1/models", unplaceable(f"gap{n}", 1))
            refused.append(status)
            assert status == 503, (status, body)
            assert "not made" in body["error"]["message"] or "election" in body["error"]["message"]
        database.start()
        leader = cluster.url(cluster.leader_port(timeout=30))
        wait_until(
            lambda: call("POST", leader + "/v1/models", unplaceable("resumed", 1))[0] in (200, 201),
            timeout=15,
            what="a write to be taken again",
        )
        names = {m["name"] for m in call("GET", leader + "/v1/models")[1]["items"]}
        assert names == {"kept", "resumed"}, "what was refused was not made, what was kept stays"
    finally:
        procs.stop_all()
        database.close()


def test_a_standby_redirects_to_the_leader_and_a_clean_stop_hands_over_at_once(
    procs, tmp_path, postgres_dsn
):
    cluster = Cluster(procs, tmp_path, postgres_dsn, servers=2, agent=False)
    leader = cluster.leader_port()
    standby = next(port for port in cluster.ports if port != leader)
    status, about = call("GET", cluster.url(standby) + "/v1/leader")
    assert (status, about["leader"], about["url"]) == (503, False, cluster.url(leader))
    status, headers, _ = post(
        cluster.url(standby) + "/v1/models?dry_run=true",
        json.dumps(unplaceable("m", 1)).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 307 and headers["Location"] == cluster.url(leader) + "/v1/models?dry_run=true"
    spec_file = tmp_path / "m.yaml"
    spec_file.write_text(yaml.safe_dump(unplaceable("m", 1)))
    # gpuctl asks the standby first, and follows its 307 with the body
    reversed_list = f"{cluster.url(standby)},{cluster.url(leader)}"
    applied = CliRunner().invoke(gpuctl, ["--server", reversed_list, "apply", "-f", str(spec_file)])
    assert applied.exit_code == 0, applied.output

    stopped_at = time.monotonic()
    assert procs.terminate(cluster.servers[leader]) == 0
    assert cluster.leader_port(timeout=10, besides=leader) == standby
    handed_over_in = time.monotonic() - stopped_at
    assert handed_over_in < LEASE_TTL_S, f"released, not left to expire: {handed_over_in:.2f} s"
    models = call("GET", cluster.url(standby) + "/v1/models")[1]["items"]
    assert [m["name"] for m in models] == ["m"]


def test_a_database_that_cannot_be_reached_is_a_clear_error_at_start(tmp_path):
    import subprocess

    from tests.harness import BIN

    answer = subprocess.run(
        [str(BIN / "gpuctl"), "server", "--listen", f"127.0.0.1:{free_port()}",
         "--state", f"postgresql://gpufleet:s3cret@127.0.0.1:{free_port()}/fleet"],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert answer.returncode == 3, answer.stderr
    assert "cannot reach PostgreSQL at postgresql://gpufleet:***@127.0.0.1" in answer.stderr
    assert "s3cret" not in answer.stderr + answer.stdout

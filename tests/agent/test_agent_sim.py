"""The agent in sim mode against a real control plane and router, all real processes."""

import json
import signal

import openai
import pytest
import yaml

from controlplane.agent.processes import process_alive
from tests.controlplane.conftest import spec
from tests.harness import call, control_plane, free_port, wait_until

pytestmark = pytest.mark.integration
FLEET = {"fabrics": [{"name": "ib-a", "nodes": 2, "gpu_class": "H100-80GB", "gpus_per_node": 2}]}
# A quick fleet: ticks of 0.2 s, heartbeats every 0.3 s, a node lost after 2 s.
SERVER_ARGS = ("--tick", "0.2", "--node-timeout", "2", "--heartbeat", "0.3")


class SimFleet:
    def __init__(self, procs, tmp_path, fleet=FLEET, server_args=()):
        self.procs = procs
        self.tmp = tmp_path
        self.fleet_file = tmp_path / "fleet.yaml"
        self.fleet_file.write_text(yaml.safe_dump(fleet))
        self.url, _ = control_plane(
            procs, tmp_path / "state.sqlite", None, *SERVER_ARGS, *server_args
        )
        self.admin_port = free_port()
        self.agent = self.start_agent()

    def start_agent(self):
        return self.procs.start(
            [
                "gpuctl",
                "agent",
                "--server",
                self.url,
                "--simulate",
                str(self.fleet_file),
                "--state-dir",
                str(self.tmp / "agent"),
                "--heartbeat",
                "0.3",
                "--stop-grace",
                "3",
                "--sim-admin",
                f"127.0.0.1:{self.admin_port}",
            ],
            self.admin_port,
            name="agent",
        )

    def admin(self, path, body):
        return call("POST", f"http://127.0.0.1:{self.admin_port}{path}", body)

    def replicas(self, state=None):
        rows = call("GET", self.url + "/v1/replicas")[1]["items"]
        return [r for r in rows if state is None or r["state"] == state]

    def engine_pids(self):
        records = self.tmp / "agent" / "nodes"
        return {
            int(p.read_text().split('"pid": ')[1].split(",")[0])
            for p in records.glob("*/replicas/*.json")
        }


def test_assignment_to_route_and_back(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", spec(name="llama", replicas=2))
    wait_until(lambda: len(fleet.replicas("Ready")) == 2, what="two Ready replicas")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.5")
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
    wait_until(lambda: [m.id for m in api.models.list()] == ["llama"], what="routes")
    answer = api.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content
    pids = fleet.engine_pids()
    assert len(pids) == 2 and all(process_alive(p) for p in pids)
    call("POST", fleet.url + "/v1/models/llama/scale", {"replicas": 1})
    wait_until(lambda: len(fleet.replicas()) == 1, what="scale down to finish")
    wait_until(lambda: sum(process_alive(p) for p in pids) == 1, what="the process to go")


def test_agent_kill_9_and_restart_leaves_no_orphan(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", spec(name="llama", replicas=2))
    wait_until(lambda: len(fleet.replicas("Ready")) == 2, what="two Ready replicas")
    pids = fleet.engine_pids()
    procs.terminate(fleet.agent, signal.SIGKILL)
    assert all(process_alive(p) for p in pids), "replicas outlive their agent"
    call("POST", fleet.url + "/v1/models/llama/scale", {"replicas": 1})
    fleet.agent = fleet.start_agent()
    wait_until(lambda: sum(process_alive(p) for p in pids) == 1, what="the unassigned one")
    assert fleet.engine_pids() <= pids, "the kept replica was adopted, not started again"
    assert len(fleet.replicas("Ready")) == 1
    procs.terminate(fleet.agent)
    assert not any(process_alive(p) for p in pids), "a stopped simulation leaves nothing"


def test_faults_gpu_unhealthy_node_silent_replica_killed(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", spec(name="llama", replicas=1))
    (replica,) = wait_until(lambda: fleet.replicas("Ready"), what="a Ready replica")
    node = replica["nodes"][0]
    other = "ib-a-1" if node == "ib-a-0" else "ib-a-0"

    status, _ = fleet.admin("/gpu/fail", {"node": other, "index": 1, "reason": "XID 79"})
    assert status == 200
    summary = wait_until(
        lambda: (
            (s := call("GET", fleet.url + "/v1/summary")[1])["capacity"]["H100-80GB"]["unhealthy"]
            == 1
            and s
        ),
        what="health",
    )
    assert summary["capacity"]["H100-80GB"] == {
        "used": 1,
        "free": 2,
        "unavailable": 0,
        "unhealthy": 1,
        "total": 4,
    }

    fleet.admin("/silence", {"node": node, "silent": True})
    moved = wait_until(
        lambda: [r for r in fleet.replicas("Ready") if r["nodes"] == [other]],
        what="the replica to move off the silent node",
    )
    assert moved[0]["placement"][0]["gpus"] == [0], "never the unhealthy GPU"
    nodes = {n["name"]: n for n in call("GET", fleet.url + "/v1/nodes")[1]["items"]}
    assert nodes[node]["status"] == "NotReady"

    fleet.admin("/silence", {"node": node, "silent": False})
    fleet.admin("/kill", {"replica": moved[0]["id"]})
    failed = wait_until(
        lambda: [r for r in fleet.replicas("Failed") if r["id"] == moved[0]["id"]],
        what="the killed replica to be Failed",
    )
    assert failed[0]["exit_code"] == -9
    wait_until(lambda: len(fleet.replicas("Ready")) == 1, what="a replacement")
    assert fleet.admin("/kill", {"replica": "nope"})[0] == 404
    assert fleet.admin("/gpu/fail", {"node": "ghost", "index": 0})[0] == 404


def test_a_two_node_replica_runs_one_rank_per_node(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call(
        "POST", fleet.url + "/v1/models", spec(name="big", gpus_per_replica=2, nodes_per_replica=2)
    )
    (replica,) = wait_until(lambda: fleet.replicas("Ready"), what="the two-node replica")
    assert sorted(replica["nodes"]) == ["ib-a-0", "ib-a-1"]
    ranks = {}
    for record in (tmp_path / "agent" / "nodes").glob("*/replicas/*.json"):
        pid = json.loads(record.read_text())["pid"]
        env = dict(
            item.split(b"=", 1)
            for item in open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            if b"=" in item
        )
        ranks[record.parent.parent.name] = (
            env[b"NODE_RANK"],
            env[b"NNODES"],
            env[b"CUDA_VISIBLE_DEVICES"],
        )
    leader = replica["placement"][0]["node"]
    follower = replica["placement"][1]["node"]
    assert ranks == {leader: (b"0", b"2", b"0,1"), follower: (b"1", b"2", b"0,1")}
    assert replica["url"].startswith("http://127.0.0.1:")

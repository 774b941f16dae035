"""A simulated fleet whose replicas run in the agent (`replicas: in_process`): the control plane,
agent and router are real processes; the replicas' engines are served by the agent itself."""

import openai
import pytest

from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, wait_until

pytestmark = pytest.mark.integration
FLEET = {
    "fabrics": [{"name": "ib-a", "nodes": 2, "gpu_class": "H100-80GB", "gpus_per_node": 2}],
    "replicas": "in_process",
}
SIM = ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}"]


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_in_process_replicas_start_serve_fail_and_stop_without_a_process(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path, fleet=FLEET)
    slow = spec(name="llama", replicas=3, command=[*SIM, "--startup-delay", "1"])
    call("POST", fleet.url + "/v1/models", slow)
    wait_until(lambda: len(fleet.replicas("Starting")) >= 1, what="a replica loading its weights")
    ready = wait_until(lambda: len(r := fleet.replicas("Ready")) == 3 and r, what="3 Ready")
    assert all("/replicas/" + r["id"] in r["url"] for r in ready)
    assert children_of(fleet.agent.pid) == [], "no engine process was started"
    assert not list((tmp_path / "agent").glob("nodes/*/replicas/*.json"))

    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.5")
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
    wait_until(lambda: [m.id for m in api.models.list()] == ["llama"], what="routes")
    answer = api.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content
    streamed = list(
        api.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert len(streamed) > 2

    # Each replica's engine is its own: a fault set on one leaves the others healthy.
    sick = ready[0]
    assert call("POST", sick["url"] + "/sim/faults", {"unhealthy": True})[0] == 200
    wait_until(
        lambda: {r["id"] for r in fleet.replicas("Unhealthy")} == {sick["id"]},
        what="that replica alone Unhealthy",
    )
    assert call("POST", sick["url"] + "/sim/faults", {"unhealthy": False})[0] == 200

    killed = ready[1]
    assert fleet.admin("/kill", {"replica": killed["id"]})[0] == 200
    failed = wait_until(
        lambda: [r for r in fleet.replicas("Failed") if r["id"] == killed["id"]],
        what="the killed replica to be Failed",
    )
    assert failed[0]["exit_code"] == -9
    assert call("GET", killed["url"] + "/health")[0] == 404
    wait_until(lambda: len(fleet.replicas("Ready")) == 3, what="a replacement")

    call("POST", fleet.url + "/v1/models/llama/scale", {"replicas": 1})
    wait_until(
        lambda: [r["state"] for r in fleet.replicas() if r["state"] != "Failed"] == ["Ready"],
        what="scale in to finish",
    )


def test_a_command_other_than_the_sim_engine_fails_and_says_why(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path, fleet=FLEET)
    call("POST", fleet.url + "/v1/models", spec(name="vllm", command=["vllm", "serve", "{model}"]))
    failed = wait_until(lambda: fleet.replicas("Failed"), what="the replica to fail")
    assert "only `gpuctl sim-engine` runs without a process" in failed[0]["reason"]
    bad = spec(name="bad", command=[*SIM, "--output-tokens", "many"])
    call("POST", fleet.url + "/v1/models", bad)
    failed = wait_until(
        lambda: [r for r in fleet.replicas("Failed") if r["model"] == "bad"], what="bad flags"
    )
    assert "cannot run in process" in failed[0]["reason"] and "many" in failed[0]["reason"]


def test_a_fleet_file_names_how_replicas_run():
    from sim.fleet import FleetFileError, parse_fleet

    assert {n.replicas for n in parse_fleet(FLEET)} == {"in_process"}
    assert {n.replicas for n in parse_fleet({"fabrics": FLEET["fabrics"]})} == {"processes"}
    with pytest.raises(FleetFileError, match="replicas: one of processes, in_process"):
        parse_fleet({**FLEET, "replicas": "threads"})

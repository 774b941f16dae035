"""The supervisor with real processes: sim engines and small Python programs."""

import asyncio
import os
import sys
import time

import aiohttp
import pytest

from controlplane.agent.processes import process_alive
from controlplane.agent.supervisor import Supervisor

ENGINE = ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}"]


def assignment(replica, command=ENGINE, gpus=(0,), rank=0):
    return {
        "replica": replica,
        "model": "m",
        "command": command,
        "env": {"EXTRA": "1"},
        "health_path": "/health",
        "gpus": list(gpus),
        "rank": rank,
        "nnodes": 1,
        "master_addr": "127.0.0.1",
    }


async def settle(supervisor, until, timeout=15.0):
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + timeout
        while True:
            await supervisor.check(session)
            if until():
                return
            assert time.monotonic() < deadline, supervisor.reports()
            await asyncio.sleep(0.1)


def environ_once_started(pid: int, timeout: float = 10.0) -> list[bytes]:
    """The environment of a process just spawned: between its fork and its exec, /proc shows
    an empty one (or its parent's, with none of the assignment's variables)."""
    deadline = time.monotonic() + timeout
    while True:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        if b"EXTRA=1" in env or time.monotonic() > deadline:
            return env
        time.sleep(0.02)


@pytest.fixture
def supervisors(tmp_path):
    made = []

    def make():
        supervisor = Supervisor(tmp_path / "node", "127.0.0.1", stop_grace_s=3)
        made.append(supervisor)
        return supervisor

    yield make
    for supervisor in made:
        supervisor.stop_all(wait_s=3)


def test_start_ready_then_unassigned_is_stopped(supervisors):
    supervisor = supervisors()
    supervisor.reconcile([assignment("r1", gpus=(2, 3))])
    run = supervisor.running["r1"]
    env = environ_once_started(run.pid)
    assert b"CUDA_VISIBLE_DEVICES=2,3" in env and b"EXTRA=1" in env and b"NODE_RANK=0" in env
    asyncio.run(settle(supervisor, lambda: supervisor.reports()["r1"]["state"] == "Ready"))
    assert supervisor.reports()["r1"]["url"] == f"http://127.0.0.1:{run.port}"
    supervisor.reconcile([])
    asyncio.run(settle(supervisor, lambda: not supervisor.stopping))
    assert not process_alive(run.pid)
    assert list((supervisor.records).glob("*.json")) == []


def test_a_crash_is_failed_with_exit_code_and_log_tail(supervisors):
    supervisor = supervisors()
    crash = [sys.executable, "-c", "print('CUDA error: out of memory'); raise SystemExit(3)"]
    supervisor.reconcile([assignment("r1", command=crash)])
    asyncio.run(settle(supervisor, lambda: "r1" in supervisor.failed))
    report = supervisor.reports()["r1"]
    assert report["state"] == "Failed" and report["exit_code"] == 3
    assert "out of memory" in report["log_tail"]
    supervisor.reconcile([assignment("r1", command=crash)])
    assert "r1" not in supervisor.running, "a failed replica is not restarted under the same id"


def test_a_missing_program_fails_clearly(supervisors):
    supervisor = supervisors()
    supervisor.reconcile([assignment("r1", command=["no-such-engine-binary", "{port}"])])
    assert "cannot start no-such-engine-binary" in supervisor.reports()["r1"]["reason"]


def test_a_restarted_agent_adopts_or_stops_what_it_started(supervisors):
    first = supervisors()
    first.reconcile([assignment("keep"), assignment("drop", gpus=(1,))])
    keep, drop = first.running["keep"].pid, first.running["drop"].pid
    for pid in (keep, drop):
        environ_once_started(pid)  # a process not yet past its exec is not the one recorded
    second = supervisors()  # a new agent on the same state directory
    assert set(second.running) == {"keep", "drop"}
    second.reconcile([assignment("keep")])
    asyncio.run(settle(second, lambda: not second.stopping))
    assert process_alive(keep) and not process_alive(drop)
    assert second.running["keep"].pid == keep


def test_a_reused_pid_is_not_adopted(supervisors, tmp_path):
    first = supervisors()
    first.reconcile([assignment("r1")])
    record = first.records / "r1.json"
    text = record.read_text().replace(str(first.running["r1"].pid), str(os.getpid()))
    first.stop_all(wait_s=3)
    record.write_text(text)
    second = supervisors()
    assert "r1" not in second.running and second.failed["r1"].state == "Failed"
    assert process_alive(os.getpid())


def test_env_from_is_read_on_the_node_and_a_missing_source_fails_clearly(
    supervisors, tmp_path, monkeypatch
):
    secret = tmp_path / "hf-token"
    secret.write_text("hf_from_a_file\n")
    monkeypatch.setenv("AGENT_SIDE_KEY", "sk-from-the-agent")
    supervisor = supervisors()
    given = {
        **assignment("r1"),
        "env_from": {"HF_TOKEN": {"file": str(secret)}, "API_KEY": {"agent_env": "AGENT_SIDE_KEY"}},
    }
    supervisor.reconcile([given])
    run = supervisor.running["r1"]
    env = environ_once_started(run.pid)
    assert b"HF_TOKEN=hf_from_a_file" in env and b"API_KEY=sk-from-the-agent" in env
    missing = {**assignment("r2"), "env_from": {"HF_TOKEN": {"file": str(tmp_path / "none")}}}
    supervisor.reconcile([given, missing])
    assert "r2" not in supervisor.running
    report = supervisor.reports()["r2"]
    assert report["state"] == "Failed" and "env_from HF_TOKEN" in report["reason"], report


def test_engines_started_together_never_share_a_port(tmp_path, monkeypatch):
    """The kernel may offer a free port twice before the first engine binds it; as it did
    for two replicas of two simulated nodes of one agent, of which one then failed."""
    from controlplane.agent import processes as module

    offered = iter([41001, 41001, 41001, 41002, 41001, 41002, 41003])
    monkeypatch.setattr(module, "free_port", lambda host="127.0.0.1": next(offered))
    ports = module.EnginePorts()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    nodes = [
        Supervisor(tmp_path / name, "127.0.0.1", stop_grace_s=3, ports=ports)
        for name in ("n1", "n2")
    ]
    try:
        nodes[0].reconcile([assignment("a", command=sleeper)])
        nodes[1].reconcile([assignment("b", command=sleeper)])
        nodes[0].reconcile([assignment("a", command=sleeper), assignment("c", command=sleeper)])
        taken = [nodes[0].running["a"].port, nodes[1].running["b"].port]
        taken.append(nodes[0].running["c"].port)
        assert taken == [41001, 41002, 41003]
    finally:
        for node in nodes:
            node.stop_all(wait_s=3)


def test_no_port_to_give_fails_the_replica_with_the_reason(tmp_path, monkeypatch):
    from controlplane.agent import processes as module

    monkeypatch.setattr(module, "free_port", lambda host="127.0.0.1": 41001)
    ports = module.EnginePorts()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    node = Supervisor(tmp_path / "n1", "127.0.0.1", stop_grace_s=3, ports=ports)
    try:
        node.reconcile([assignment("a", command=sleeper)])
        node.reconcile([assignment("a", command=sleeper), assignment("b", command=sleeper)])
        assert set(node.running) == {"a"}
        report = node.reports()["b"]
        assert report["state"] == "Failed" and "cannot give the engine a port" in report["reason"]
    finally:
        node.stop_all(wait_s=3)


def test_an_engine_is_told_to_sleep_and_to_wake_as_its_assignment_says(supervisors):
    supervisor = supervisors()
    slow_waker = [*ENGINE, "--wake-delay", "0.5"]
    asleep = {**assignment("r1", command=slow_waker), "engine": "vllm", "sleep": 1}
    awake = {**asleep, "sleep": 0}
    supervisor.reconcile([awake])
    run = supervisor.running["r1"]
    asyncio.run(settle(supervisor, lambda: run.state == "Ready"))
    supervisor.reconcile([asleep])
    asyncio.run(settle(supervisor, lambda: run.state == "Asleep"))
    assert supervisor.reports()["r1"]["state"] == "Asleep"

    async def is_sleeping():
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{run.port}/is_sleeping"
            async with session.get(url) as resp:
                return (await resp.json())["is_sleeping"]

    assert asyncio.run(is_sleeping()) is True
    supervisor.reconcile([awake])
    asyncio.run(settle(supervisor, lambda: run.state == "Ready"))
    assert asyncio.run(is_sleeping()) is False, "Ready once the engine says it is awake"
    assert process_alive(run.pid), "the same process throughout: no cold start"


def test_a_failed_sleep_order_is_reported_and_the_engine_keeps_serving(supervisors):
    supervisor = supervisors()
    custom = {"sleep": "/no-such-path", "wake": "/wake_up", "asleep": "/is_sleeping"}
    a = {**assignment("r1"), "engine": "custom", "engine_endpoints": custom, "sleep": 0}
    supervisor.reconcile([a])
    run = supervisor.running["r1"]
    asyncio.run(settle(supervisor, lambda: run.state == "Ready"))
    supervisor.reconcile([{**a, "sleep": 2}])
    asyncio.run(settle(supervisor, lambda: "sleep failed: HTTP 404" in run.reason))
    assert run.state == "Ready"


def test_an_engine_that_loads_adapters_itself_keeps_those_it_was_never_told_to_hold():
    from controlplane.agent.supervisor import Running, adapters_to_unload

    run = Running("r", "llama", 1, 8000, [], [0], 0, "/health", 0.0)
    run.adapters_wanted = {"a1": "s3://a1"}
    run.ever_assigned = ["a1", "a2"]
    held = ["a1", "a2", "a3"]  # a3: loaded by its resolver on a request, not yet taken on
    assert adapters_to_unload(run, held) == ["a2", "a3"], "an engine of the plain kind"
    run.adapter_resolver = True
    assert adapters_to_unload(run, held) == ["a2"], "only what it was told, then not"

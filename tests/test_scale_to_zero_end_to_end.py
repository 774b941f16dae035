"""Scale to zero and wake on request with real processes: control plane, sim agent, router and
sim engines that take seconds to 'load their weights'."""

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner

from cli.main import gpuctl
from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, post, wait_until
from tests.router.fake_upstreams import relaying

pytestmark = pytest.mark.integration
STARTUP_S = 2.0
CHAT = json.dumps({"model": "sleepy", "messages": [{"role": "user", "content": "hi"}]}).encode()


def sleepy_spec(**fields):
    command = [
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}",
        "--startup-delay", str(STARTUP_S), "--ttft", "0.05",
    ]  # fmt: skip
    fields = {"min_replicas": 0, "scale_to_zero_after": "4s", **fields}
    return spec(name="sleepy", command=command, **fields)


def at_zero(fleet) -> bool:
    model = call("GET", fleet.url + "/v1/models/sleepy")[1]
    return model["state"] == "ScaledToZero" and not model["replicas"]


def placed_events(fleet) -> list[dict]:
    events = call("GET", fleet.url + "/v1/models/sleepy")[1]["events"]
    return [e for e in events if " placed on " in e["message"]]


def started_in(fleet) -> float:
    """The engine's own start-up: from its placement to its Ready, as the events tell."""
    events = call("GET", fleet.url + "/v1/models/sleepy")[1]["events"]
    placed = [e["at"] for e in events if " placed on " in e["message"]][-1]
    ready = [e["at"] for e in events if e["message"].endswith(" Ready")][-1]
    return ready - placed


def test_idle_model_goes_to_zero_and_200_requests_wake_it(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", sleepy_spec())
    wait_until(lambda: fleet.replicas("Ready"), timeout=30, what="the first replica")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    wait_until(lambda: post(router + "/v1/chat/completions", CHAT)[0] == 200, what="a route")
    last_use = time.monotonic()
    wait_until(lambda: at_zero(fleet), timeout=30, what="the idle model to reach zero")
    assert time.monotonic() - last_use >= 4, "not before scale_to_zero_after"
    capacity = call("GET", fleet.url + "/v1/summary")[1]["capacity"]["H100-80GB"]
    assert capacity["used"] == 0, "its GPUs are free"

    placed_before = len(placed_events(fleet))
    statuses, first_answer = wake_with(router, 200)
    assert statuses == [200] * 200
    assert len(placed_events(fleet)) == placed_before + 1, "exactly one replica started"
    assert started_in(fleet) >= STARTUP_S, "Ready only once /health stopped answering 503"
    # How long the wake took is measured against the engine's start-up in bench/.
    print(
        f"wake: engine start-up {started_in(fleet):.2f} s, first answer after {first_answer:.2f} s"
    )


def wake_with(router: str, requests: int) -> tuple[list[int], float]:
    """`requests` at once to a model at zero: their statuses, and when the first was answered."""
    answered = []
    asked = time.monotonic()

    def one(_):
        status, _, _ = post(router + "/v1/chat/completions", CHAT, timeout=60)
        answered.append(time.monotonic() - asked)
        return status

    with ThreadPoolExecutor(requests) as pool:
        statuses = list(pool.map(one, range(requests)))
    return statuses, min(answered)


def test_a_request_during_the_stop_is_served(procs, tmp_path):
    # Two routers; the slow one's route watch stalls before the replica turns idle, so it keeps
    # reporting a table with the route and the stop is held; a request then comes through the
    # other. (Its acknowledgement would otherwise come at once: router/control/acks.py.)
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", sleepy_spec())
    wait_until(lambda: fleet.replicas("Ready"), timeout=30, what="the first replica")
    port = int(fleet.url.rsplit(":", 1)[1])
    with relaying(port) as relay:
        router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
        procs.router("--control-plane", relay.url, "--tick", "2", "--router-id", "slow")
        wait_until(lambda: post(router + "/v1/chat/completions", CHAT)[0] == 200, what="routes")
        relay.stall_routes()
        wait_until(
            lambda: any(r["state"] == "Retiring" for r in fleet.replicas()),
            timeout=30,
            what="the idle replica to retire",
        )
        status, _, _ = post(router + "/v1/chat/completions", CHAT, timeout=60)
        assert status == 200, "served by the woken or a new replica, never lost"


def test_park_max_overflow_answers_503_and_the_held_ones_complete(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", sleepy_spec(replicas=1))
    wait_until(lambda: fleet.replicas("Ready"), timeout=30, what="the first replica")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3", "--park-max", "5")
    wait_until(lambda: post(router + "/v1/chat/completions", CHAT)[0] == 200, what="a route")
    wait_until(lambda: at_zero(fleet), timeout=30, what="zero")
    results = []
    lock = threading.Lock()

    def one():
        status, headers, _ = post(router + "/v1/chat/completions", CHAT, timeout=60)
        with lock:
            results.append((status, headers.get("Retry-After")))

    senders = [threading.Thread(target=one) for _ in range(8)]
    for sender in senders:
        sender.start()
        time.sleep(0.05)
    for sender in senders:
        sender.join()
    assert sorted(s for s, _ in results) == [200] * 5 + [503] * 3
    assert all(retry == "1" for s, retry in results if s == 503)
    with urllib.request.urlopen(router + "/metrics") as resp:
        text = resp.read().decode()
    assert 'gpurouter_wake_seconds_count{model="sleepy"} 1' in text


def test_a_silent_router_blocks_the_stop_and_the_dry_run_says_so(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", sleepy_spec(scale_to_zero_after="1h"))
    wait_until(lambda: fleet.replicas("Ready"), timeout=30, what="the replica")
    port = int(fleet.url.rsplit(":", 1)[1])
    with relaying(port) as relay:
        procs.router("--control-plane", relay.url, "--tick", "0.3", "--router-id", "edge-cut")
        wait_until(lambda: fleet.replicas()[0]["idle_state"] == "at_least", what="a report")
        relay.cut()
        wait_until(lambda: fleet.replicas()[0]["idle_state"] == "unknown", what="silence")
        runner = CliRunner()
        dry = runner.invoke(
            gpuctl, ["--server", fleet.url, "stop-idle", "--dry-run", "--idle-after", "1s"]
        )
        assert dry.exit_code == 0, dry.output
        assert "silent router edge-cut may be using it" in dry.output
        assert "0 replica(s) would free 0 GPU(s)" in dry.output
        assert [r["state"] for r in fleet.replicas()] == ["Ready"]

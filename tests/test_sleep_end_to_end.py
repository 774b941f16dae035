"""Sleeping engines with real processes: control plane, sim agent, router, sim engines that take
seconds to load and a fraction of one to wake. One card, two models: an idle one sleeps on it,
the other is placed beside it, and a request for the sleeper swaps them by sleep and wake, not
by a cold start."""

import time

import openai
import pytest
from click.testing import CliRunner

from cli.main import gpuctl
from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, wait_until

pytestmark = pytest.mark.integration
COLD_START_S = 3.0
WAKE_S = 0.3
ONE_CARD = {"fabrics": [{"name": "ib-a", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 1}]}


def engine_spec(name: str, after: str) -> dict:
    command = [
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}",
        "--startup-delay", str(COLD_START_S), "--wake-delay", str(WAKE_S), "--ttft", "0.02",
    ]  # fmt: skip
    return spec(
        name=name,
        command=command,
        engine="vllm",
        sleep={"level": 1, "after": after, "wake_timeout": "30s"},
        min_replicas=0,
        min_residency="0s",
        gpu_memory="60GB",
        sleep_gpu_memory="2GB",
    )


def replica_of(fleet, model: str) -> dict:
    (row,) = [r for r in fleet.replicas() if r["model"] == model]
    return row


def ask(api, model: str) -> float:
    started = time.monotonic()
    answer = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], timeout=60
    )
    assert answer.choices[0].message.content
    return time.monotonic() - started


def test_an_idle_engine_sleeps_and_a_request_swaps_it_in_by_waking(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path, fleet=ONE_CARD)
    call("POST", fleet.url + "/v1/models", engine_spec("alpha", after="2s"))
    wait_until(lambda: fleet.replicas("Ready"), timeout=30, what="alpha Ready")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
    wait_until(lambda: [m.id for m in api.models.list()] == ["alpha"], what="alpha's route")
    ask(api, "alpha")
    alpha = replica_of(fleet, "alpha")["id"]

    wait_until(lambda: replica_of(fleet, "alpha")["state"] == "Asleep", timeout=30, what="sleep")
    summary = call("GET", fleet.url + "/v1/summary")[1]
    assert summary["asleep"]["replicas"] == 1 and summary["asleep"]["cards"] == 1
    assert summary["capacity"]["H100-80GB"]["used"] == 0, "its card is free for an awake one"
    shown = CliRunner().invoke(gpuctl, ["--server", fleet.url, "replicas", "-o", "wide"]).output
    assert "Asleep" in shown and "ib-a-0:0" in shown, shown
    described = CliRunner().invoke(gpuctl, ["--server", fleet.url, "models", "alpha"]).output
    assert "STATE        Asleep" in described, described
    assert "SLEEP        vllm level 1, after 2s idle; wake within 30s" in described, described
    status = CliRunner().invoke(gpuctl, ["--server", fleet.url, "status"]).output
    assert "ASLEEP    1 replica(s) on 1 card(s): 1.9 GiB of GPU memory" in status, status

    # beta is placed beside the sleeper (60 GB awake + 2 GB asleep fit on an 80 GB card).
    call("POST", fleet.url + "/v1/models", engine_spec("beta", after="10m"))
    wait_until(lambda: replica_of(fleet, "beta")["state"] == "Ready", timeout=30, what="beta")
    wait_until(lambda: "beta" in [m.id for m in api.models.list()], what="beta's route")
    ask(api, "beta")
    time.sleep(1.0)  # beta goes unused for a moment: it may be taken, and it sleeps

    swap = ask(api, "alpha")
    assert replica_of(fleet, "alpha")["id"] == alpha, "woken, not started anew"
    assert replica_of(fleet, "alpha")["state"] == "Ready"
    wait_until(lambda: replica_of(fleet, "beta")["state"] == "Asleep", what="beta asleep")
    events = call("GET", fleet.url + "/v1/models/alpha")[1]["events"]
    assert sum(" placed on " in e["message"] for e in events) == 1, "one cold start, ever"
    assert any("woken in" in e["message"] for e in events)

    metrics = call_text(fleet.url + "/metrics")
    assert 'gpufleet_wakes_total{model="alpha"} 1' in metrics
    assert 'gpufleet_sleeps_total{model="beta"} 1' in metrics
    print(f"swap by sleep and wake: first answer after {swap:.2f} s; cold start {COLD_START_S} s")


def call_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def wakes(fleet, model: str) -> int:
    metrics = call_text(fleet.url + "/metrics")
    line = f'gpufleet_wakes_total{{model="{model}"}} '
    return sum(int(float(row[len(line) :])) for row in metrics.splitlines() if row.startswith(line))


def test_two_models_taking_turns_swap_once_per_turn_not_back_and_forth(procs, tmp_path):
    """A demand outlives the request it was made for (the lease): once the routers' reports say
    nobody waits, it no longer takes the card back from the model that just made way."""
    fleet = SimFleet(procs, tmp_path, fleet=ONE_CARD)
    for name in ("alpha", "beta"):
        call("POST", fleet.url + "/v1/models", engine_spec(name, after="1h"))
    router, _ = procs.router("--control-plane", fleet.url)
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
    for model in ("alpha", "beta", "alpha", "beta"):
        ask(api, model)
        time.sleep(3.0)
    assert (wakes(fleet, "alpha"), wakes(fleet, "beta")) == (1, 1), "one wake per turn"
    assert replica_of(fleet, "beta")["state"] == "Ready"
    assert replica_of(fleet, "alpha")["state"] == "Asleep"

"""Several models awake on one card, with real processes: control plane, sim agent with one
80 GB card, router, sim engines. Three 20 GB models are Ready on that card at once and each
serves; a fourth of 40 GB makes the idlest of them sleep, never the one streaming."""

import threading
import time

import openai
import pytest
from click.testing import CliRunner

from cli.main import gpuctl
from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, wait_until

pytestmark = pytest.mark.integration
ONE_CARD = {"fabrics": [{"name": "ib-a", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 1}]}


def small(name: str, gpu_memory: str = "20GB") -> dict:
    command = [
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}",
        "--startup-delay", "0.5", "--wake-delay", "0.2", "--ttft", "0.02",
        "--tokens-per-s", "20", "--output-tokens", "60",
    ]  # fmt: skip
    return spec(
        name=name,
        command=command,
        engine="vllm",
        sleep={"level": 1, "after": "1h", "wake_timeout": "30s"},
        min_replicas=0,
        min_residency="1s",
        gpu_memory=gpu_memory,
    )


def ready(fleet) -> dict[str, dict]:
    return {r["model"]: r for r in fleet.replicas("Ready")}


def test_three_models_share_a_card_and_a_fourth_puts_the_idlest_to_sleep(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path, fleet=ONE_CARD)
    for name in ("alpha", "beta", "gamma"):
        assert call("POST", fleet.url + "/v1/models", small(name))[0] == 201
    wait_until(lambda: len(ready(fleet)) == 3, timeout=30, what="three Ready")
    placed = {(p["node"], tuple(p["gpus"])) for r in fleet.replicas() for p in r["placement"]}
    assert placed == {("ib-a-0", (0,))}, "all three on the one card"
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)
    wait_until(lambda: len(api.models.list().data) == 3, what="three routes")
    for name in ("gamma", "alpha"):  # gamma is used first: the idlest of the three
        answer = api.chat.completions.create(model=name, messages=[], max_tokens=2)
        assert answer.model == name and answer.choices[0].message.content
        time.sleep(1.0)
    streamed: list[str] = []

    def stream_beta():
        chunks = api.chat.completions.create(model="beta", messages=[], stream=True)
        streamed.extend(c.choices[0].delta.content or "" for c in chunks if c.choices)

    streaming = threading.Thread(target=stream_beta)
    streaming.start()
    time.sleep(0.5)
    summary = call("GET", fleet.url + "/v1/summary")[1]
    assert summary["capacity"]["H100-80GB"]["used"] == 1, "one card, USED once"
    assert 0 < summary["memory"]["H100-80GB"]["held_mb"] <= 81559
    wide = CliRunner().invoke(gpuctl, ["--server", fleet.url, "nodes", "-o", "wide"]).output
    assert all(ready(fleet)[m]["id"] in wide for m in ("alpha", "beta", "gamma")), wide

    assert call("POST", fleet.url + "/v1/models", small("delta", "40GB"))[0] == 201
    wait_until(lambda: "delta" in [m.id for m in api.models.list()], what="delta's route")
    answer = api.chat.completions.create(model="delta", messages=[], max_tokens=2)
    assert answer.model == "delta"
    streaming.join(timeout=30)
    assert len("".join(streamed).split()) >= 50, "beta's stream ran to its end"
    states = {r["model"]: r["state"] for r in fleet.replicas()}
    assert states["gamma"] in ("Sleeping", "Asleep"), states
    assert states["beta"] == "Ready" and states["alpha"] == "Ready", states

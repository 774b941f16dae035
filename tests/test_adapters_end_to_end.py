"""LoRA adapters with real processes: control plane, sim agent, router and sim engines that load
adapters at run time as vLLM does (and answer 404 for one they do not hold), used through the
official openai client. Requests for each adapter are answered, which they could not be on a
replica without it; when the replicas are full, the adapter idle longest makes way; a load
that fails is shown with the engine's reason."""

import time

import openai
import pytest
import yaml
from click.testing import CliRunner

from cli.main import gpuctl
from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, get, wait_until

pytestmark = pytest.mark.integration
FLEET = {"fabrics": [{"name": "ib-a", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 2}]}
BASE = spec(
    name="llama",
    replicas=2,
    max_adapters=2,
    command=[
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}", "--max-loras", "2",
        "--adapter-load-delay", "0.2", "--ttft", "0.01",
    ],
)  # fmt: skip


def adapter(name: str, source: str | None = None) -> dict:
    return {
        "kind": "adapter",
        "name": name,
        "base": "llama",
        "source": source or f"s3://loras/{name}",
        "idle_after": "2s",
    }


def held_by_engines(fleet) -> dict[str, list[str]]:
    out = {}
    for row in fleet.replicas("Ready"):
        status, body = get(row["url"] + "/v1/models")
        assert status == 200
        out[row["id"]] = sorted(
            m["id"] for m in yaml.safe_load(body)["data"] if m.get("parent") == "llama"
        )
    return out


def test_adapters_load_on_demand_route_to_holders_and_make_way(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path, fleet=FLEET)
    call("POST", fleet.url + "/v1/models", BASE)
    wait_until(lambda: len(fleet.replicas("Ready")) == 2, timeout=30, what="two replicas")
    names = ["a1", "a2", "a3", "a4", "a5"]
    for name in names:
        assert call("POST", fleet.url + "/v1/adapters", adapter(name))[0] == 201
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=30)
    wait_until(lambda: "a5" in [m.id for m in api.models.list()], what="adapters listed")

    def ask(name: str) -> str:
        answer = api.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        return answer.model

    for name in names[:4]:  # parked, loaded on demand, then answered by a holder
        assert ask(name) == name
    held = held_by_engines(fleet)
    assert sorted(a for names_ in held.values() for a in names_) == names[:4]
    assert all(len(v) == 2 for v in held.values()), "two on each: the least loaded took each"
    for _ in range(20):  # every request for a loaded adapter reaches a replica that holds it
        assert ask("a1") == "a1"

    time.sleep(2.5)  # a1..a4 go unused past their idle_after
    assert ask("a5") == "a5", "the idlest adapter made way"
    held = held_by_engines(fleet)
    assert sum(len(v) for v in held.values()) == 4 and any("a5" in v for v in held.values())
    rows = {a["name"]: a for a in call("GET", fleet.url + "/v1/adapters")[1]["items"]}
    assert rows["a5"]["state"] == "Loaded"
    assert sum(rows[n]["state"] == "NotLoaded" for n in names[:4]) == 1

    status = CliRunner().invoke(gpuctl, ["--server", fleet.url, "status"]).output
    assert "ADAPTERS  5 (4 loaded" in status, status
    metrics = get(fleet.url + "/metrics")[1].decode()
    assert 'gpufleet_adapter_loads_total{adapter="a5"} 1' in metrics
    assert sum(f'gpufleet_adapter_unloads_total{{adapter="{n}"}} 1' in metrics
               for n in names[:4]) == 1  # fmt: skip


def test_a_failed_load_is_shown_with_the_engines_reason(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path, fleet=FLEET)
    call("POST", fleet.url + "/v1/models", BASE)
    wait_until(lambda: len(fleet.replicas("Ready")) == 2, timeout=30, what="two replicas")
    call("POST", fleet.url + "/v1/adapters", adapter("ghost", source="/nowhere/ghost"))
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3", "--park-timeout", "4")
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=30)
    wait_until(lambda: "ghost" in [m.id for m in api.models.list()], what="listed")
    with pytest.raises(openai.APIStatusError) as refused:
        api.chat.completions.create(model="ghost", messages=[{"role": "user", "content": "x"}])
    assert refused.value.status_code == 503
    shown = CliRunner().invoke(gpuctl, ["--server", fleet.url, "adapters", "-o", "wide"]).output
    assert "No adapter found at /nowhere/ghost" in shown, shown
    row = call("GET", fleet.url + "/v1/adapters/ghost")[1]
    assert row["reason"].startswith("failed to load:")
    assert sum("failed to load on" in e["message"] for e in row["events"]) == 2, "once each"

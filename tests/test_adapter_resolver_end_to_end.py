"""Adapters an engine loads itself (vLLM's LoRA resolver), with real processes: control plane,
sim agent, router and sim engines with a resolver folder, used through the official openai
client. A request for an adapter nobody holds goes at once to a replica with a free slot,
whose engine loads it; the control plane learns the holding and routes the next requests to
that holder. An adapter the resolver cannot load answers the engine's 404, is not sent to a
resolver again, and its next request takes the control plane's own path."""

import json

import openai
import pytest
from click.testing import CliRunner

from cli.main import gpuctl
from controlplane.state.routetable import resolver_endpoints
from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, get, wait_until

pytestmark = pytest.mark.integration
FLEET = {"fabrics": [{"name": "ib-a", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 2}]}


def base(resolver_dir) -> dict:
    return spec(
        name="llama",
        replicas=2,
        max_adapters=2,
        adapter_resolver=True,
        command=[
            "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}", "--max-loras", "2",
            "--adapter-load-delay", "0.2", "--ttft", "0.01", "--lora-resolver-dir",
            str(resolver_dir),
        ],
    )  # fmt: skip


def adapter(name: str) -> dict:
    return {"kind": "adapter", "name": name, "base": "llama", "source": f"s3://loras/{name}"}


def router_counts(router: str) -> dict[str, int]:
    text = get(router + "/metrics")[1].decode()
    return {
        line.split('"')[1]: int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("gpurouter_adapter_requests_total{")
    }


@pytest.fixture
def fleet(procs, tmp_path):
    folder = tmp_path / "loras"
    for name in ("a1", "a2"):
        (folder / name).mkdir(parents=True)
        (folder / name / "adapter_config.json").write_text(json.dumps({"r": 8}))
    found = SimFleet(procs, tmp_path, fleet=FLEET)
    assert call("POST", found.url + "/v1/models", base(folder))[0] == 201
    wait_until(lambda: len(found.replicas("Ready")) == 2, timeout=30, what="two replicas")
    for name in ("a1", "a2", "ghost"):  # ghost: registered, but no resolver finds it
        assert call("POST", found.url + "/v1/adapters", adapter(name))[0] == 201
    return found


def routes(fleet) -> dict:
    return call("GET", fleet.url + "/v1/routes")[1]


def resolvers_of(fleet, adapter: str) -> list[dict]:
    return resolver_endpoints(routes(fleet).get("resolvers", {}), adapter)


def test_an_adapter_nobody_holds_is_loaded_where_the_request_lands(procs, fleet):
    wait_until(lambda: resolvers_of(fleet, "a1"), what="resolvers published")
    assert {e["id"].split("@")[1] for e in resolvers_of(fleet, "a1")} == {"a1"}
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=30)
    wait_until(lambda: "a1" in [m.id for m in api.models.list()], what="adapters listed")
    assert not any("@" in m.id for m in api.models.list()), "resolver routes are not models"

    answer = api.chat.completions.create(model="a1", messages=[{"role": "user", "content": "hi"}])
    assert answer.model == "a1"
    assert router_counts(router) == {"holder": 0, "resolver": 1, "waited": 0}, "not parked"

    # The control plane learns the holding from the engine and publishes it as a holder.
    def holder():
        endpoints = routes(fleet)["routes"]["a1"]
        return endpoints[0]["id"] if len(endpoints) == 1 else None

    held_at = wait_until(holder, what="a1's holder published")
    others = [e["id"] for e in resolvers_of(fleet, "a1")]
    assert held_at not in others, "its holder is no resolver of it; the other replica still is"
    for _ in range(5):
        api.chat.completions.create(model="a1", messages=[{"role": "user", "content": "x"}])
    assert router_counts(router) == {"holder": 5, "resolver": 1, "waited": 0}
    replicas = {r["id"]: r for r in fleet.replicas("Ready")}
    replica = held_at.split("@")[0]
    assert replicas[replica]["adapters"] == ["a1"]
    assert replicas[replica]["adapter_loads"] == {"ordered": 0, "resolved": 1}
    wide = CliRunner().invoke(gpuctl, ["--server", fleet.url, "replicas", "-o", "wide"]).output
    (line,) = [row for row in wide.splitlines() if row.startswith(replica)]
    assert " 1 (0+1) " in line, wide
    metrics = get(fleet.url + "/metrics")[1].decode()
    assert 'gpufleet_adapter_resolved_total{adapter="a1"} 1' in metrics
    assert 'gpufleet_adapter_loads_total{adapter="a1"} 0' in metrics, "no load was ordered"
    events = [e["message"] for e in call("GET", fleet.url + "/v1/adapters/a1")[1]["events"]]
    assert f"loaded by the engine of {replica} on a first request" in events, events


def test_an_adapter_the_resolver_cannot_load_takes_the_control_planes_path_next(procs, fleet):
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3", "--park-timeout", "8")
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=30)
    wait_until(lambda: "ghost" in [m.id for m in api.models.list()], what="adapters listed")
    with pytest.raises(openai.NotFoundError) as missing:
        api.chat.completions.create(model="ghost", messages=[{"role": "user", "content": "x"}])
    assert "does not exist" in missing.value.message, "the engine's error, as OpenAI's shape"
    assert missing.value.body["code"] == "model_not_found"
    assert router_counts(router)["resolver"] == 1

    def recorded():
        rows = fleet.replicas("Ready")
        return [r["id"] for r in rows if "ghost" in (r.get("adapter_failures") or {})]

    (failed_on,) = wait_until(recorded, what="the failure recorded on its replica")
    wait_until(lambda: not resolvers_of(fleet, "ghost"), what="no resolver for it")
    assert resolvers_of(fleet, "a1"), "the other adapters keep theirs"
    # The next request waits for the control plane, which loads it (from its source) on the
    # other replica: never again where it failed.
    answer = api.chat.completions.create(model="ghost", messages=[{"role": "user", "content": "x"}])
    assert answer.model == "ghost"
    events = [e["message"] for e in call("GET", fleet.url + "/v1/adapters/ghost")[1]["events"]]
    assert router_counts(router) == {"holder": 0, "resolver": 1, "waited": 1}, events
    holders = [e["id"].split("@")[0] for e in routes(fleet)["routes"]["ghost"]]
    assert holders and failed_on not in holders
    # And the other adapters still resolve.
    api.chat.completions.create(model="a2", messages=[{"role": "user", "content": "x"}])
    assert router_counts(router)["resolver"] == 2

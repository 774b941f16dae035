"""The fleet with a real engine: llama.cpp's `llama-server`, started by the agent from the spec
in docs/examples/llama-cpp.yaml, serving a tiny random-weights llama, used through gpurouter
with the official openai client. Only the GPUs are simulated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.agent.test_agent_sim import FLEET, SimFleet
from tests.harness import BIN, get, wait_until

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "llama-cpp.yaml"
MODEL = "tiny-llama"
# One session for every request to the shared fleet: all of them reach the same replica.
USER = "llama-tests"
# More tokens than the engine could write while a test looks: a stream of this length that
# ends early was stopped, not finished.
LONG = 4000


def example_spec() -> dict:
    spec = yaml.safe_load(EXAMPLE.read_text())
    assert spec["name"] == MODEL
    return spec


def spec_for(binary: Path, gguf: Path) -> dict:
    """The documented spec, with this machine's binary and model file and the sim's GPU class."""
    spec = example_spec()
    command = list(spec["command"])
    command[0] = str(binary)
    command[command.index("--model") + 1] = str(gguf)
    return {**spec, "command": command, "gpu_class": FLEET["fabrics"][0]["gpu_class"]}


class LlamaFleet:
    """Control plane, simulated inventory, agent, two llama-server replicas and a router."""

    def __init__(self, procs, tmp: Path, binary: Path, gguf: Path) -> None:
        self.sim = SimFleet(procs, tmp)
        spec_file = tmp / "tiny-llama.yaml"
        spec_file.write_text(yaml.safe_dump(spec_for(binary, gguf)))
        applied = subprocess.run(
            [str(BIN / "gpuctl"), "--server", self.sim.url, "apply", "-f", str(spec_file)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert applied.returncode == 0, applied.stderr
        wait_until(lambda: len(self.ready()) == 2, timeout=60, what="two Ready llama-servers")
        self.router, _ = procs.router("--control-plane", self.sim.url, "--tick", "0.3")
        self.api = openai.OpenAI(
            base_url=self.router + "/v1", api_key="none", max_retries=0, timeout=30
        )
        wait_until(lambda: self.served_names() == [MODEL], what="the route to the engines")

    def ready(self) -> list[dict]:
        return [r for r in self.sim.replicas("Ready") if r["model"] == MODEL]

    def served_names(self) -> list[str]:
        try:
            return [m.id for m in self.api.models.list()]
        except openai.APIError:
            return []

    def engine_pids(self) -> dict[str, int]:
        """Each engine's URL and the PID the agent recorded for it."""
        records = self.sim.tmp / "agent" / "nodes"
        pids = {}
        for path in records.glob("*/replicas/*.json"):
            record = json.loads(path.read_text())
            pids[f"http://127.0.0.1:{record['port']}"] = record["pid"]
        return pids


def engine_metric(engine: str, name: str) -> float:
    status, body = get(engine + "/metrics")
    assert status == 200, body
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name
    )


def busy_slots(engine: str) -> list[dict]:
    status, body = get(engine + "/slots")
    assert status == 200, body
    return [slot for slot in json.loads(body) if slot["is_processing"]]


def chat(**fields) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about GPUs."}],
        "user": USER,
        **fields,
    }


@pytest.fixture(scope="module")
def fleet(llama_build, tiny_llama, tmp_path_factory):
    from tests.harness import Processes

    tmp = tmp_path_factory.mktemp("llama-fleet")
    procs = Processes(tmp)
    try:
        yield LlamaFleet(procs, tmp, llama_build.binary, tiny_llama)
    finally:
        procs.stop_all()


@pytest.fixture
def own_fleet(llama_build, tiny_llama, procs, tmp_path):
    """A fleet for one test that breaks or dirties it."""
    return LlamaFleet(procs, tmp_path, llama_build.binary, tiny_llama)


def test_models_lists_the_served_name(fleet):
    assert fleet.served_names() == [MODEL]
    for engine in fleet.engine_pids():
        status, body = get(engine + "/v1/models")
        assert status == 200 and MODEL in body.decode(), "the engine itself serves that name"


def test_chat_and_completions_report_usage(fleet):
    answer = fleet.api.chat.completions.create(**chat(max_tokens=8))
    assert answer.choices[0].message.content is not None
    assert answer.usage.prompt_tokens > 0
    assert 0 < answer.usage.completion_tokens <= 8
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens

    completion = fleet.api.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, user=USER
    )
    assert completion.choices[0].text is not None
    assert completion.usage.prompt_tokens > 0
    assert 0 < completion.usage.completion_tokens <= 8


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streams_end_with_a_usage_chunk(fleet, endpoint):
    options = {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 12}
    if endpoint == "chat":
        stream = fleet.api.chat.completions.create(**chat(**options))
    else:
        stream = fleet.api.completions.create(
            model=MODEL, prompt="Once upon a time", user=USER, **options
        )
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) >= 2, "tokens arrive as separate chunks"
    assert with_choices[-1].choices[0].finish_reason in ("length", "stop")
    last = chunks[-1]
    assert last.usage is not None, "the last chunk carries the usage"
    assert 0 < last.usage.completion_tokens <= 12
    assert all(c.usage is None for c in chunks[:-1])
    if endpoint == "chat":
        assert last.choices == [], "a chunk of its own, as OpenAI sends it"
    # llama-server's completions stream puts the usage on the chunk with the finish reason.


def test_a_client_that_leaves_mid_stream_stops_the_generation(fleet):
    stream = fleet.api.chat.completions.create(
        **chat(stream=True, max_tokens=LONG, extra_body={"ignore_eos": True})
    )
    received = [chunk for chunk, _ in zip(stream, range(5), strict=False)]
    assert len(received) == 5
    engines = list(fleet.engine_pids())
    assert any(busy_slots(e) for e in engines), "the engine is generating"
    stream.close()

    wait_until(lambda: not any(busy_slots(e) for e in engines), timeout=10, what="idle slots")
    written = {e: engine_metric(e, "llamacpp:n_decode_total") for e in engines}
    time.sleep(0.5)
    assert written == {e: engine_metric(e, "llamacpp:n_decode_total") for e in engines}, (
        "no engine goes on decoding for the client that left"
    )
    predicted = sum(engine_metric(e, "llamacpp:tokens_predicted_total") for e in engines)
    assert predicted < LONG, f"the engine stopped early ({predicted:.0f} of {LONG} tokens)"


def test_idle_is_exact_for_the_replica_that_served_and_a_bound_for_the_other(fleet):
    fleet.api.chat.completions.create(**chat(max_tokens=4))
    served_by = {
        engine: engine_metric(engine, "llamacpp:prompt_tokens_total") > 0
        for engine in fleet.engine_pids()
    }
    assert sorted(served_by.values()) == [False, True], "one session, one replica"

    def idle_states():
        rows = {r["url"]: r["idle_state"] for r in fleet.ready()}
        return rows if "unknown" not in rows.values() else None

    states = wait_until(idle_states, timeout=10, what="the router's activity report")
    for engine, served in served_by.items():
        assert states[engine] == ("exact" if served else "at_least"), (engine, states)


def test_an_endpoint_the_engine_lacks_returns_its_error_and_ejects_nothing(own_fleet):
    for _ in range(12):
        with pytest.raises(openai.APIStatusError) as refused:
            own_fleet.api.embeddings.create(model=MODEL, input="hello")
        assert refused.value.status_code == 501
        assert "embedding" in refused.value.message.lower(), "the engine's own words"
    status, body = get(own_fleet.router + "/metrics")
    ejections = [
        sample
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "gpurouter_ejections_total" and sample.value > 0
    ]
    assert ejections == []
    users = [f"user-{n}" for n in range(16)]
    for user in users:
        own_fleet.api.chat.completions.create(**chat(max_tokens=2, user=user))
    engines = own_fleet.engine_pids()
    served = [e for e in engines if engine_metric(e, "llamacpp:prompt_tokens_total") > 0]
    assert len(served) == 2, "both replicas still take chats"


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error(own_fleet):
    stream = own_fleet.api.chat.completions.create(
        **chat(stream=True, max_tokens=LONG, extra_body={"ignore_eos": True})
    )
    assert len([chunk for chunk, _ in zip(stream, range(3), strict=False)]) == 3
    pids = own_fleet.engine_pids()
    serving = [e for e in pids if busy_slots(e)]
    assert len(serving) == 1
    os.kill(pids[serving[0]], signal.SIGKILL)

    with pytest.raises(openai.APIError) as broken:
        for _ in stream:
            pass
    assert "replica" in str(broken.value.message).lower()

    answer = own_fleet.api.chat.completions.create(**chat(max_tokens=2))
    assert answer.usage.completion_tokens > 0, "the same session now goes to the other replica"
    survivor = next(e for e in pids if e != serving[0])
    assert engine_metric(survivor, "llamacpp:prompt_tokens_total") > 0

    def replaced():
        now = own_fleet.engine_pids()
        return len(own_fleet.ready()) == 2 and pids[serving[0]] not in now.values()

    wait_until(replaced, timeout=60, what="the agent to bring a second engine back")
    answer = own_fleet.api.chat.completions.create(**chat(max_tokens=2, user="after"))
    assert answer.choices

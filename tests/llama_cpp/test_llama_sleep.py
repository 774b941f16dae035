"""A real engine that sleeps by itself: llama.cpp's server with `--sleep-idle-seconds`. The agent
reads `is_sleeping` from its `/props`, the fleet shows it Asleep and keeps routing to it, and a
request through gpurouter wakes it. The test prints its wake against its cold start."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.agent.test_agent_sim import SimFleet
from tests.harness import call, get, wait_until
from tests.llama_cpp.test_llama_server import MODEL, spec_for

pytestmark = pytest.mark.integration
IDLE_S = 2


def sleeping(engine: str) -> bool:
    status, body = get(engine + "/props")
    assert status == 200, body
    return json.loads(body)["is_sleeping"]


def test_llama_server_sleeps_by_itself_shows_asleep_and_a_request_wakes_it(
    llama_build, tiny_llama, procs, tmp_path
):
    spec = spec_for(llama_build.binary, tiny_llama)
    command = [*spec["command"], "--sleep-idle-seconds", str(IDLE_S)]
    spec = {**spec, "command": command, "replicas": 1, "engine": "llama.cpp"}
    fleet = SimFleet(procs, tmp_path)
    asked_at = time.time()
    assert call("POST", fleet.url + "/v1/models", spec)[0] in (200, 201)
    (ready,) = wait_until(lambda: fleet.replicas("Ready"), timeout=60, what="llama-server Ready")
    cold_start = time.time() - asked_at
    engine = ready["url"]

    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0, timeout=30)
    wait_until(lambda: [m.id for m in api.models.list()] == [MODEL], what="the route")
    messages = [{"role": "user", "content": "hi"}]
    api.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)

    wait_until(lambda: fleet.replicas("Asleep"), timeout=30, what="the fleet to show it Asleep")
    assert sleeping(engine), "the engine itself says it sleeps"
    assert [m.id for m in api.models.list()] == [MODEL], "still routed: a request wakes it"

    started = time.monotonic()
    answer = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    wake = time.monotonic() - started
    assert answer.choices
    assert not sleeping(engine)

    def woken_event():
        events = call("GET", f"{fleet.url}/v1/models/{MODEL}")[1]["events"]
        return any(e["message"].endswith("woken by a request") for e in events)

    # It falls asleep again IDLE_S after the answer: the fleet saw it awake in between.
    wait_until(woken_event, timeout=10, what="the fleet to see it awake again")
    print(
        f"llama.cpp: first answer from sleep {wake:.2f} s; cold start (apply to Ready)"
        f" {cold_start:.2f} s"
    )

"""Traces through the real processes: a client's traceparent -> the router's span -> the
engine's span, sent to an OTLP receiver; nothing of OpenTelemetry loaded when traces are off."""

import subprocess
import sys

import openai
import pytest

from tests.harness import free_port, get, wait_until
from tests.otlp_receiver import Receiver

pytestmark = pytest.mark.integration
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture
def receiver():
    found = Receiver()
    yield found
    found.close()


def test_one_trace_shows_client_router_and_engine(procs, receiver):
    engine = procs.engine("chat", ttft=0.01, otlp_traces_endpoint=receiver.url)
    router, _ = procs.router(
        f"--backend=chat={engine}", "--otlp-endpoint", receiver.url, "--trace-sample", "0",
        env=FAST_EXPORT,
    )  # fmt: skip
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0)
    traced = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    answer = api.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        extra_headers=traced,
    )  # fmt: skip
    for _ in range(3):  # sampled at 0 and without a traceparent: no span
        api.chat.completions.create(model="chat", messages=[], max_tokens=1)
    api.chat.completions.create(  # the client said not sampled: no span either
        model="chat", messages=[], max_tokens=1,
        extra_headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"},
    )  # fmt: skip
    wait_until(
        lambda: (
            receiver.of("gpurouter")
            and [s for s in receiver.of("sim-engine") if s["trace_id"] == CLIENT_TRACE]
        ),
        what="the router's span and the engine's",
    )
    [span] = receiver.of("gpurouter")
    assert span["name"] == "chat chat"
    assert (span["trace_id"], span["parent_id"]) == (CLIENT_TRACE, CLIENT_SPAN)
    attributes = span["attributes"]
    assert attributes["gen_ai.request.model"] == "chat"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
    assert attributes["http.response.status_code"] == 200
    assert attributes["gpufleet.replica"]
    assert span["events"] == ["picked", "first_byte"], span["events"]
    assert span["event_attributes"]["picked"]["gpufleet.attempt"] == 1
    # The engine traces each request it gets (the others as traces of their own, as vLLM
    # does); the one with the router's traceparent continues the client's trace.
    [engine_span] = [s for s in receiver.of("sim-engine") if s["trace_id"] == CLIENT_TRACE]
    assert engine_span["parent_id"] == span["span_id"], "as the router's span's child"


def test_a_request_without_a_traceparent_is_sampled_and_starts_a_trace(procs, receiver):
    engine = procs.engine("chat")
    router, _ = procs.router(
        f"--backend=chat={engine}", "--otlp-endpoint", receiver.url, "--trace-sample", "1",
        env=FAST_EXPORT,
    )  # fmt: skip
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0)
    api.chat.completions.create(model="chat", messages=[], max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="nope", messages=[], max_tokens=1)
    wait_until(lambda: len(receiver.of("gpurouter")) == 2, what="two spans")
    spans = {s["attributes"]["gen_ai.request.model"]: s for s in receiver.of("gpurouter")}
    assert spans["chat"]["parent_id"] == "" and len(spans["chat"]["trace_id"]) == 32
    assert spans["nope"]["attributes"]["http.response.status_code"] == 404
    # Counted once the collector's answer is back, a moment after it holds the spans.
    sent = {"sent": 2, "failed": 0, "dropped": 0}
    wait_until(lambda: span_counts(router) == sent, what=f"the router's counts {sent}")


def span_counts(router: str) -> dict[str, int]:
    _, text = get(router + "/metrics")
    return {
        line.split('"')[1]: int(line.rsplit(" ", 1)[1])
        for line in text.decode().splitlines()
        if line.startswith("gpurouter_trace_spans_total{")
    }


def test_spans_a_collector_does_not_take_are_counted_and_the_request_is_served(procs):
    engine = procs.engine("chat")
    router, _ = procs.router(
        f"--backend=chat={engine}", "--otlp-endpoint", f"http://127.0.0.1:{free_port()}/v1/traces",
        "--trace-sample", "1",
    )  # fmt: skip
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0)
    assert api.chat.completions.create(model="chat", messages=[], max_tokens=1).choices
    counts = wait_until(lambda: span_counts(router)["failed"] == 1 and span_counts(router), 15)
    assert counts == {"sent": 0, "failed": 1, "dropped": 0}


def test_a_request_that_waited_for_a_slot_says_why_and_how_long(procs, receiver):
    from concurrent.futures import ThreadPoolExecutor

    engine = procs.engine("chat", ttft=0.5)
    router, _ = procs.router(
        f"--backend=chat={engine}", "--otlp-endpoint", receiver.url, "--trace-sample", "1",
        "--max-in-flight", "1", env=FAST_EXPORT,
    )  # fmt: skip
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: api.chat.completions.create(model="chat", messages=[]), range(2)))
    wait_until(lambda: len(receiver.of("gpurouter")) == 2, what="two spans")
    [waited] = [s for s in receiver.of("gpurouter") if "parked" in s["events"]]
    assert waited["events"] == ["parked", "picked", "first_byte"]
    assert waited["event_attributes"]["parked"]["reason"] == "saturated"
    assert waited["event_attributes"]["picked"]["gpufleet.parked_s"] >= 0.3


def test_nothing_of_opentelemetry_is_imported_when_traces_are_off():
    code = (
        "import sys, router.main, router.server, router.exchange, controlplane.server;"
        "print([m for m in sys.modules if m.startswith('opentelemetry')])"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert shown.stdout.strip() == "[]", shown.stdout + shown.stderr


def test_the_control_plane_traces_its_decisions_and_changes(procs, tmp_path, receiver):
    from tests.controlplane.conftest import make_node, spec
    from tests.harness import call, control_plane

    url, _ = control_plane(
        procs, tmp_path / "state.sqlite", None, "--tick", "0.2", "--otlp-endpoint", receiver.url,
        env=FAST_EXPORT,
    )  # fmt: skip
    call("POST", url + "/v1/nodes", make_node("n1", gpus=2))
    assert call("POST", url + "/v1/models", spec(name="chat"))[0] in (200, 201)
    assert call("POST", url + "/v1/models", {"name": "bad"})[0] == 400
    for _ in range(3):
        call("POST", url + "/v1/nodes/n1/heartbeat", {})
    wait_until(
        lambda: any(s["name"].startswith("tick ") for s in receiver.of("gpuctl-server")),
        what="a tick step's span",
    )
    spans = receiver.of("gpuctl-server")
    changes = {(s["name"], s["attributes"]["http.response.status_code"]) for s in spans
               if not s["name"].startswith("tick ")}  # fmt: skip
    assert ("POST /v1/models", 201) in changes or ("POST /v1/models", 200) in changes, changes
    assert ("POST /v1/models", 400) in changes, changes
    assert not any("heartbeat" in name for name, _ in changes), "traffic is not a change"
    placed = [s for s in spans if s["name"].startswith("tick ") and "Place" in s["events"]]
    assert placed and placed[0]["attributes"]["gpufleet.actions.Place"] == 1, spans

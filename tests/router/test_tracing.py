"""Traces through the real processes: a client's traceparent -> the router's span -> the
engine's span, sent to an OTLP receiver; nothing of OpenTelemetry loaded when traces are off."""

import asyncio
import socket
import subprocess
import sys
from types import SimpleNamespace

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
        "import sys, router.main, router.server, router.path.exchange, controlplane.server;"
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
    def arrived():  # spans come in batches of their own: wait for each kind asked about
        spans = receiver.of("gpuctl-server")
        names = {(s["name"], s["attributes"].get("http.response.status_code")) for s in spans}
        return any(s["name"].startswith("tick ") for s in spans) and (
            ("POST /v1/models", 400) in names
        )

    wait_until(arrived, what="a tick step's span and the refused change's")
    spans = receiver.of("gpuctl-server")
    changes = {(s["name"], s["attributes"]["http.response.status_code"]) for s in spans
               if not s["name"].startswith("tick ")}  # fmt: skip
    assert ("POST /v1/models", 201) in changes or ("POST /v1/models", 200) in changes, changes
    assert ("POST /v1/models", 400) in changes, changes
    assert not any("heartbeat" in name for name, _ in changes), "traffic is not a change"
    placed = [s for s in spans if s["name"].startswith("tick ") and "Place" in s["events"]]
    assert placed and placed[0]["attributes"]["gpufleet.actions.Place"] == 1, spans


def test_the_engine_gets_the_routers_span_in_place_of_every_traceparent_the_client_sent():
    from router.telemetry.tracing import RequestTrace

    trace = RequestTrace(None, 0xAB, 0xCD, 0xEF, "chat", "m", b"rid", b"/v1/completions", True)
    sent = (
        b"traceparent: 00-1-2-01\r\nx-traceparent: keep\r\naccept: */*\r\n"
        b"traceparent: 00-3-4-01\r\n"
    )
    forward = trace.forward(sent)
    assert forward == (
        b"x-traceparent: keep\r\naccept: */*\r\n"
        b"traceparent: 00-000000000000000000000000000000ab-00000000000000cd-01\r\n"
    )


def decoded(*ended: tuple):
    """The spans of one export of `ended` (what RequestTrace.end hands the exporter), parsed
    as a collector parses OTLP/JSON: a malformed body fails here."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from router.telemetry.tracing import _span
    from tests.otlp_receiver import _ids_as_base64

    body = b'{"resourceSpans":[{"resource":{},"scopeSpans":[{"scope":{},"spans":[%s]}]}]}' % (
        b",".join(_span(e) for e in ended)
    )
    message = json_format.Parse(_ids_as_base64(body), ExportTraceServiceRequest())
    return list(message.resource_spans[0].scope_spans[0].spans)


def attributes_of(held) -> dict:
    from tests.otlp_receiver import _value

    return {a.key: _value(a.value) for a in held.attributes}


def test_a_span_with_every_part_encodes_to_what_was_recorded():
    from router.telemetry.tracing import RequestTrace

    trace = RequestTrace(
        None, 0xAB, 0xCD, 0xEF, "chat", 'm"odel', 'r"é\n'.encode(), b"/v1/chat/completions", False
    )  # fmt: skip
    trace.parked("saturated")
    trace.waited_on("1" * 32, "2" * 16)
    trace.picked("replica-1", 3, True, 1)
    trace.retried("connect")
    trace.picked('replica-"2"', 0, False, 2)
    trace.first_byte()
    ended = []
    trace.exporter = type("Exporter", (), {"put": staticmethod(ended.append)})
    trace.end(200, "acme", 11, 5, True)
    [span] = decoded(*ended)
    assert (span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex()) == (
        f"{0xAB:032x}", f"{0xCD:016x}", f"{0xEF:016x}"
    )
    assert span.name == 'chat m"odel' and span.kind == 2
    assert span.start_time_unix_nano == trace.start_ns <= span.end_time_unix_nano
    assert attributes_of(span) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": 'm"odel',
        "gpufleet.request_id": 'r"é\n',
        "url.path": "/v1/chat/completions",
        "http.response.status_code": 200,
        "gpufleet.replica": 'replica-"2"',
        "gpufleet.tenant": "acme",
        "gen_ai.usage.input_tokens": 11,
        "gen_ai.usage.output_tokens": 5,
    }
    assert span.status.code == 2, "a cut answer is an error"
    assert [(link.trace_id.hex(), link.span_id.hex()) for link in span.links] == [
        ("1" * 32, "2" * 16)
    ]
    events = [(e.name, attributes_of(e)) for e in span.events]
    assert [name for name, _ in events] == [
        "parked", "picked", "retried", "picked", "first_byte", "cut"
    ]  # fmt: skip
    assert events[0][1] == {"reason": "saturated", "gpufleet.wake.trace_id": "1" * 32}
    first_pick = events[1][1]
    assert first_pick.pop("gpufleet.parked_s") >= 0
    assert first_pick == {
        "gpufleet.replica": "replica-1",
        "gpufleet.replica.load": 3,
        "gpufleet.load.engine_reported": True,
        "gpufleet.attempt": 1,
    }
    assert events[2][1] == {"reason": "connect"}
    assert events[3][1] == {
        "gpufleet.replica": 'replica-"2"',
        "gpufleet.replica.load": 0,
        "gpufleet.load.engine_reported": False,
        "gpufleet.attempt": 2,
    }
    assert events[4][1] == events[5][1] == {}
    times = [e.time_unix_nano for e in span.events]
    assert times == sorted(times)


def test_a_span_that_never_reached_a_replica_has_no_more_than_it_knows():
    from router.telemetry.tracing import RequestTrace

    trace = RequestTrace(None, 1, 2, 0, "text_completion", "nope", b"id", b"/v1/completions", False)
    [span] = decoded((trace, trace.start_ns, 404, None, -1, -1, False))
    assert span.parent_span_id == b"" and not span.events and not span.links
    assert span.status.code == 0
    assert attributes_of(span) == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.request.model": "nope",
        "gpufleet.request_id": "id",
        "url.path": "/v1/completions",
        "http.response.status_code": 404,
    }


def test_posts_share_one_connection_and_one_the_collector_closed_is_opened_again():
    from router.telemetry.tracing import OtlpJsonExporter, RequestTrace

    collector = Receiver(keep_alive=True)

    async def scenario():
        exporter = OtlpJsonExporter(collector.url, "gpurouter", "test")

        async def post_one():
            trace = RequestTrace(exporter, 1, 2, 0, "chat", "m", b"id", b"/", False)
            await exporter._post([(trace, trace.start_ns, 200, None, -1, -1, False)])

        try:
            await post_one()
            await post_one()
            ports = collector.post_ports
            assert len(ports) == 2 and ports[0] == ports[1]
            collector.drop_connections()
            await post_one()
            assert len(ports) == 3 and ports[2] != ports[0]
            assert (exporter.sent, exporter.failed) == (3, 0)
            assert len(collector.of("gpurouter")) == 3
        finally:
            await exporter.close()

    try:
        asyncio.run(scenario())
    finally:
        collector.close()


def test_a_collector_that_does_not_answer_is_not_asked_twice():
    from router.telemetry.tracing import OtlpJsonExporter, RequestTrace

    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(8)  # takes connections, never reads nor answers
    port = frozen.getsockname()[1]

    async def scenario():
        exporter = OtlpJsonExporter(f"http://127.0.0.1:{port}/v1/traces", "gpurouter", "test")
        exporter.timeout_s = 0.3
        # As if kept from an earlier post: a failure on a kept connection is what may be
        # retried.
        exporter.connection = await asyncio.open_connection("127.0.0.1", port)
        trace = RequestTrace(exporter, 1, 2, 0, "chat", "m", b"id", b"/", False)
        await exporter._post([(trace, trace.start_ns, 200, None, -1, -1, False)])
        assert (exporter.sent, exporter.failed) == (0, 1)
        await exporter.close()

    try:
        asyncio.run(scenario())
        frozen.settimeout(0.5)
        taken = [frozen.accept()[0]]
        frozen.settimeout(0.2)
        try:
            taken.append(frozen.accept()[0])
        except TimeoutError:
            pass
        for held in taken:
            held.close()
        assert len(taken) == 1, f"posted on {len(taken)} connections"
    finally:
        frozen.close()


def test_spans_wait_for_a_batch_or_the_interval_and_the_last_go_out_at_close(monkeypatch):
    """A batch's worth is posted at once; fewer wait for the interval, or for close."""
    from router.telemetry import tracing
    from router.telemetry.tracing import OtlpJsonExporter, RequestTrace

    monkeypatch.setattr(tracing, "BATCH", 4)
    collector = Receiver(keep_alive=True)

    async def scenario():
        exporter = OtlpJsonExporter(collector.url, "gpurouter", "test")

        def put(count):
            for _ in range(count):
                trace = RequestTrace(exporter, 1, 2, 0, "chat", "m", b"id", b"/", False)
                exporter.put((trace, trace.start_ns, 200, None, -1, -1, False))

        put(4)  # a batch: posted at once
        while exporter.queue:  # until the batch is taken for its post
            await asyncio.sleep(0)
        put(1)  # while it is posted: not posted right after it, but with the next batch
        for _ in range(200):
            await asyncio.sleep(0.01)
            if exporter.sent:
                break
        await asyncio.sleep(0.1)
        assert exporter.sent == 4 and len(exporter.queue) == 1
        exporter.queue.clear()
        put(3)  # fewer: they wait for the interval
        await asyncio.sleep(0.3)
        assert exporter.sent == 4 and len(exporter.queue) == 3
        await exporter.close()
        assert (exporter.sent, exporter.failed, len(exporter.queue)) == (7, 0, 0)

    try:
        asyncio.run(scenario())
        assert len(collector.of("gpurouter")) == 7
    finally:
        collector.close()


class ParkedRequest:
    """What parking needs of an exchange: its model and its trace."""

    def __init__(self, model: str, trace) -> None:
        self.routed_model = model
        self.trace = trace

    def refuse_waiting(self, reason: str) -> None:
        pass


class AnsweringReporter:
    """The control plane's answer to a demand: room is being made, with its wake's trace."""

    def __init__(self, wake: tuple[str, str]) -> None:
        self.wake = wake

    async def demand(self, model, waiting, parent):
        return "", False, self.wake


def test_a_request_parked_after_the_wake_was_answered_is_linked_to_it():
    import asyncio

    from router.path.context import ProxyConfig, ProxyContext
    from router.path.fastpath import EndpointTable
    from router.server import RouterServer
    from router.telemetry.tracing import RequestTrace

    wake = ("1" * 32, "2" * 16)
    server = SimpleNamespace(reporter=AnsweringReporter(wake), demands=set())

    def traced() -> ParkedRequest:
        return ParkedRequest("m", RequestTrace(None, 1, 2, 0, "chat", "m", b"r", b"/v1", False))

    async def park_before_and_after_the_answer():
        ctx = ProxyContext(EndpointTable(), ProxyConfig())  # on the loop, as the router's
        ctx.on_demand = lambda model, waiting: RouterServer.ask_for(server, ctx, model, waiting)
        first = traced()
        assert ctx.park(first)  # sends the demand
        await asyncio.gather(*server.demands)
        later = traced()
        assert ctx.park(later)
        assert first.trace.wake == later.trace.wake == wake
        ctx.refuse_parked("m", "gone")
        assert ctx.wake_traces == {}, "a later wait is a wake of its own"

    asyncio.run(park_before_and_after_the_answer())

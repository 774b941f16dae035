"""OpenTelemetry traces of requests: one span per request through the router, a child of the
client's (W3C `traceparent`), whose own context goes to the engine, so that a trace shows
client -> router -> engine (vLLM and SGLang continue it with `--otlp-traces-endpoint`).

Only with `gpurouter --otlp-endpoint URL` (the optional extra `gpufleet[otel]`): without it
this module imports nothing of OpenTelemetry and the request path makes no call here.

Sampling: a request that brings a `traceparent` follows its sampled flag (the client decided);
of those without, one in 1/`--trace-sample` is traced (a countdown drawn afresh each time, so
that periodic traffic is not sampled in step with it). An unsampled request costs the compiled
exchange a countdown and a search of its header lines; its `traceparent`, if any, goes on to the
engine untouched.

The span is named as the GenAI semantic conventions name an inference span (`chat MODEL`),
with `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens` and
`output_tokens` (the engine's `usage`), `http.response.status_code`, and gpufleet's own
`gpufleet.tenant`, `gpufleet.replica`, `gpufleet.request_id`. Events: `parked` (why; on
release, how long), `picked` (which replica, its load, whether the engine reported it),
`retried` (why), `first_byte`, `cut` (the answer broke off).

A sampled request records its span as plain values on the request path; a thread of its own
encodes them as OTLP/JSON and posts them in batches (every 5 s, or 512 at a time) to the
collector (OTLP over HTTP, which every collector takes in JSON as in protobuf). Not through
the OpenTelemetry SDK: its span and its encoder cost 45-70 µs a span, measured, which at 1%
sampling took 8% of the rate per core of a router that spends 19 µs a request; this way a
span costs about 10 µs in all. (The control plane and the simulated engine, whose rates are
low, use the SDK.)
"""

from __future__ import annotations

import http.client
import logging
import random
import re
import threading
import time
from collections import deque
from urllib.parse import urlsplit

import orjson

log = logging.getLogger("gpurouter.tracing")

TRACEPARENT = b"traceparent: "
BATCH = 512  # spans a post
EXPORT_EVERY_S = 5.0  # as the SDK's batch processor: fewer, larger posts
QUEUED_MOST = 20_000  # spans waiting to be posted; beyond, new ones are dropped (and counted)
SERVER_KIND = 2  # OTLP's SPAN_KIND_SERVER
STATUS_ERROR = 2
HEADER = re.compile(rb"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
OPERATIONS = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "text_completion",
    b"/v1/embeddings": "embeddings",
    b"/v1/responses": "chat",
}


def parse_traceparent(value: bytes) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a W3C `traceparent`, or None for a bad one."""
    found = HEADER.match(value.strip())
    if found is None:
        return None
    trace_id, span_id = int(found.group(1), 16), int(found.group(2), 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(found.group(3), 16) & 1)


def header_line(forward: bytes) -> tuple[int, int] | None:
    """Where the `traceparent` line is among a request's forwarded header lines."""
    at = forward.find(TRACEPARENT)
    if at < 0 or (at and forward[at - 2 : at] != b"\r\n"):
        return None
    end = forward.find(b"\r\n", at)
    return (at, end + 2) if end >= 0 else None


class RequestTrace:
    """One sampled request's span, as plain values, filled in as the exchange reaches its
    points; `end` hands it to the exporter, whose thread makes the span's attributes."""

    __slots__ = ("exporter", "trace_id", "span_id", "parent_id", "operation", "model",
                 "request_id", "path", "start_ns", "events", "traceparent", "parked_at",
                 "replica", "wake")  # fmt: skip

    def __init__(self, exporter, trace_id: int, span_id: int, parent_id: int, operation: str,
                 model: str, request_id: bytes, path: bytes) -> None:  # fmt: skip
        self.exporter = exporter
        self.trace_id, self.span_id, self.parent_id = trace_id, span_id, parent_id
        self.operation, self.model, self.request_id, self.path = operation, model, request_id, path
        self.start_ns = time.time_ns()
        self.events: list = []  # (name, wall ns, attributes or None)
        # The header the engine gets: this span as its parent.
        self.traceparent = b"traceparent: 00-%032x-%016x-01\r\n" % (trace_id, span_id)
        self.parked_at = 0.0
        self.replica = ""
        self.wake: tuple[str, str] | None = None  # the control plane's trace of this wait

    def traceparent_value(self) -> str:
        return self.traceparent[len(TRACEPARENT) : -2].decode()

    def forward(self, forward: bytes) -> bytes:
        """The request's header lines with this span as the engine's parent."""
        line = header_line(forward)
        if line is not None:
            forward = forward[: line[0]] + forward[line[1] :]
        return forward + self.traceparent

    def parked(self, why: str) -> None:
        self.parked_at = time.monotonic()
        self.events.append(("parked", time.time_ns(), {"reason": why}))

    def waited_on(self, trace_id: str, span_id: str) -> None:
        """The control plane's trace of placing or waking what this parked request waits for
        (its ids, in hex): named on the `parked` event and linked from this span."""
        self.wake = (trace_id, span_id)
        for name, _, attributes in self.events:
            if name == "parked":
                attributes["gpufleet.wake.trace_id"] = trace_id

    def picked(self, replica: str, load: int, reported: bool, attempt: int) -> None:
        attributes = {
            "gpufleet.replica": replica,
            "gpufleet.replica.load": load,
            "gpufleet.load.engine_reported": reported,
            "gpufleet.attempt": attempt,
        }
        if self.parked_at:
            attributes["gpufleet.parked_s"] = time.monotonic() - self.parked_at
            self.parked_at = 0.0
        self.events.append(("picked", time.time_ns(), attributes))
        self.replica = replica

    def retried(self, why: str) -> None:
        self.events.append(("retried", time.time_ns(), {"reason": why}))

    def first_byte(self) -> None:
        self.events.append(("first_byte", time.time_ns(), None))

    def end(self, status: int, tenant: str | None, prompt: int, completion: int, cut: bool):
        if cut:
            self.events.append(("cut", time.time_ns(), None))
        self.exporter.put((self, time.time_ns(), status, tenant, prompt, completion, cut))


def span_attributes(trace: RequestTrace, status: int, tenant, prompt: int, completion: int):
    """The span's attributes, made on the export thread."""
    attributes = {
        "gen_ai.operation.name": trace.operation,
        "gen_ai.request.model": trace.model,
        "gpufleet.request_id": trace.request_id.decode(errors="replace"),
        "url.path": trace.path.decode(errors="replace"),
        "http.response.status_code": status,
    }
    if trace.replica:
        attributes["gpufleet.replica"] = trace.replica
    if tenant:
        attributes["gpufleet.tenant"] = tenant
    if prompt >= 0:
        attributes["gen_ai.usage.input_tokens"] = prompt
    if completion >= 0:
        attributes["gen_ai.usage.output_tokens"] = completion
    return attributes


class Tracing:
    """The router's tracer: which requests are traced, and their spans' exporter."""

    def __init__(self, endpoint: str, sample: float, service: str = "gpurouter") -> None:
        self.sample = sample
        self.random = random.random
        self.bits = random.getrandbits
        self.exporter = OtlpJsonExporter(endpoint, service, "gpufleet.router")

    def next_countdown(self) -> int:
        """Requests until the next sampled one: 1/sample on average, drawn uniformly."""
        if self.sample <= 0:
            return 1 << 62
        mean = 1.0 / self.sample
        if mean <= 1.0:
            return 1
        return 1 + int(self.random() * (2 * mean - 1))

    def begin(self, request, model: str, request_id: bytes, due: bool) -> RequestTrace | None:
        """`due`: this request is the sampled share's next, if the client did not decide."""
        forward = request.forward
        parent = None
        if TRACEPARENT in forward:
            line = header_line(forward)
            if line is not None:
                parent = parse_traceparent(forward[line[0] + len(TRACEPARENT) : line[1] - 2])
        if parent is not None:
            if not parent[2]:
                return None  # the client's decision: not sampled
            trace_id, parent_id = parent[0], parent[1]
        elif due:
            trace_id, parent_id = self.bits(128) or 1, 0
        else:
            return None
        return RequestTrace(
            self.exporter, trace_id, self.bits(64) or 1, parent_id,
            OPERATIONS.get(request.path, "chat"), model, request_id, request.path,
        )  # fmt: skip

    def metrics_lines(self) -> list[str]:
        exporter = self.exporter
        lines = [
            "# HELP gpurouter_trace_spans_total Spans of sampled requests, by what became of"
            " them: sent to the collector, failed (the collector refused or could not be"
            " reached), dropped (more waiting than the exporter holds).",
            "# TYPE gpurouter_trace_spans_total counter",
        ]
        for outcome, count in (
            ("sent", exporter.sent),
            ("failed", exporter.failed),
            ("dropped", exporter.dropped),
        ):
            lines.append(f'gpurouter_trace_spans_total{{outcome="{outcome}"}} {count}')
        return lines

    def close(self) -> None:
        self.exporter.close()


class OtlpJsonExporter:
    """Spans posted as OTLP/JSON from a thread of its own, in batches."""

    def __init__(self, endpoint: str, service: str, scope: str) -> None:
        parts = urlsplit(endpoint)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port
        self.path = parts.path or "/v1/traces"
        self.resource = orjson.dumps({"attributes": [_encode("service.name", service)]})
        self.scope = orjson.dumps({"name": scope})
        self.queue: deque = deque()
        self.dropped = self.sent = self.failed = 0
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self.thread.start()

    def put(self, span: tuple) -> None:
        if len(self.queue) >= QUEUED_MOST:
            self.dropped += 1
            return
        self.queue.append(span)
        if len(self.queue) >= BATCH:
            self.wake.set()

    def _run(self) -> None:
        while not self.stopping:
            self.wake.wait(EXPORT_EVERY_S)
            self.wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        while self.queue:
            batch = []
            while self.queue and len(batch) < BATCH:
                batch.append(self.queue.popleft())
            self._post(batch)

    def _post(self, batch: list) -> None:
        body = b'{"resourceSpans":[{"resource":%s,"scopeSpans":[{"scope":%s,"spans":[%s]}]}]}' % (
            self.resource,
            self.scope,
            b",".join([_span(s) for s in batch]),
        )
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        try:
            connection = kind(self.host, self.port, timeout=10)
            connection.request("POST", self.path, body, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            answer.read()
            connection.close()
            ok = 200 <= answer.status < 300
        except OSError as exc:
            ok = False
            answer = exc
        if ok:
            self.sent += len(batch)
            return
        self.failed += len(batch)
        if self.failed == len(batch):  # the first failure is said; the rest are counted
            log.warning("traces could not be sent to %s: %s", self.host, answer)

    def close(self) -> None:
        self.stopping = True
        self.wake.set()
        self.thread.join(15)


ENCODED: dict = {}  # (key, value) -> its encoding: models, replicas and codes repeat
ENCODED_MOST = 8192
REPEATED = frozenset({
    "gen_ai.operation.name", "gen_ai.request.model", "url.path", "gpufleet.replica",
    "gpufleet.tenant", "http.response.status_code", "gpufleet.load.engine_reported",
    "gpufleet.attempt", "gpufleet.replica.load", "reason",
})  # fmt: skip


def _attribute(key: str, value) -> bytes:
    """An attribute as OTLP/JSON has it, as bytes; the common ones encoded once (on the export
    thread alone: no lock)."""
    found = ENCODED.get((key, value))
    if found is not None:
        return found
    found = orjson.dumps(_encode(key, value))
    if key in REPEATED and len(ENCODED) < ENCODED_MOST:
        ENCODED[(key, value)] = found
    return found


def _encode(key: str, value) -> dict:
    kind = type(value)
    if kind is str:
        return {"key": key, "value": {"stringValue": value}}
    if kind is bool:
        return {"key": key, "value": {"boolValue": value}}
    if kind is int:
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"doubleValue": value}}


def _attributes(values) -> bytes:
    return b",".join([_attribute(k, v) for k, v in values.items()]) if values else b""


def _span(ended: tuple) -> bytes:
    """A span as OTLP/JSON, written from parts: what is the same from span to span is encoded
    once."""
    trace, end, status, tenant, prompt, completion, cut = ended
    attributes = span_attributes(trace, status, tenant, prompt, completion)
    events = b",".join(
        [b'{"name":%s,"timeUnixNano":"%d","attributes":[%s]}'
         % (_name(n), at, _attributes(a)) for n, at, a in trace.events]
    )  # fmt: skip
    parent = b',"parentSpanId":"%016x"' % trace.parent_id if trace.parent_id else b""
    status_part = b',"status":{"code":%d}' % STATUS_ERROR if status >= 500 or cut else b""
    if trace.wake is not None:
        status_part += b',"links":[{"traceId":"%s","spanId":"%s"}]' % (
            trace.wake[0].encode(), trace.wake[1].encode())  # fmt: skip
    name = _name(f"{trace.operation} {trace.model}")
    return (
        b'{"traceId":"%032x","spanId":"%016x"%s,"name":%s,"kind":%d,"startTimeUnixNano":"%d",'
        b'"endTimeUnixNano":"%d","attributes":[%s],"events":[%s]%s}'
        % (trace.trace_id, trace.span_id, parent, name, SERVER_KIND, trace.start_ns, end,
           _attributes(attributes), events, status_part)
    )  # fmt: skip


NAMES: dict = {}


def _name(name: str) -> bytes:
    found = NAMES.get(name)
    if found is None:
        found = orjson.dumps(name)
        if len(NAMES) < ENCODED_MOST:
            NAMES[name] = found
    return found

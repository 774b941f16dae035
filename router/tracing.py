"""OpenTelemetry traces of requests: one span per request through the router, a child of the
client's (W3C `traceparent`), whose own context goes to the engine, so that a trace shows
client -> router -> engine (vLLM and SGLang continue it with `--otlp-traces-endpoint`).

Only with `gpurouter --otlp-endpoint URL` (the optional extra `gpufleet[otel]`): without it
this module imports nothing of OpenTelemetry and the request path makes no call here.

Sampling: a request that brings a `traceparent` follows its sampled flag (the client decided);
one without is sampled at `--trace-sample`. An unsampled request costs a search of its header
lines and a random number; its `traceparent`, if any, goes on to the engine untouched.

The span is named as the GenAI semantic conventions name an inference span (`chat MODEL`),
with `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens` and
`output_tokens` (the engine's `usage`), `http.response.status_code`, and gpufleet's own
`gpufleet.tenant`, `gpufleet.replica`, `gpufleet.request_id`. Events: `parked` (why; on
release, how long), `picked` (which replica, its load, whether the engine reported it),
`retried` (why), `first_byte`, `cut` (the answer broke off). Spans are exported in batches on
the SDK's own thread (OTLP over HTTP).
"""

from __future__ import annotations

import random
import re
import time

TRACEPARENT = b"traceparent: "
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
    """One sampled request's span, as the exchange reaches its points."""

    __slots__ = ("span", "traceparent", "parked_at")

    def __init__(self, span, traceparent: bytes) -> None:
        self.span = span
        self.traceparent = traceparent  # the header the engine gets: this span as its parent
        self.parked_at = 0.0

    def forward(self, forward: bytes) -> bytes:
        """The request's header lines with this span as the engine's parent."""
        line = header_line(forward)
        if line is not None:
            forward = forward[: line[0]] + forward[line[1] :]
        return forward + self.traceparent

    def parked(self, why: str) -> None:
        self.parked_at = time.monotonic()
        self.span.add_event("parked", {"reason": why})

    def picked(self, replica: str, load: int, reported: bool, attempt: int) -> None:
        attributes = {
            "gpufleet.replica": replica,
            "gpufleet.replica.load": load,
            "gpufleet.load.engine_reported": reported,
            "gpufleet.attempt": attempt,
        }
        if self.parked_at:
            attributes["gpufleet.parked_s"] = round(time.monotonic() - self.parked_at, 6)
            self.parked_at = 0.0
        self.span.add_event("picked", attributes)
        self.span.set_attribute("gpufleet.replica", replica)

    def retried(self, why: str) -> None:
        self.span.add_event("retried", {"reason": why})

    def first_byte(self) -> None:
        self.span.add_event("first_byte")

    def end(self, status: int, tenant: str | None, prompt: int, completion: int, cut: bool):
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        span.set_attribute("http.response.status_code", status)
        if tenant:
            span.set_attribute("gpufleet.tenant", tenant)
        if prompt >= 0:
            span.set_attribute("gen_ai.usage.input_tokens", prompt)
        if completion >= 0:
            span.set_attribute("gen_ai.usage.output_tokens", completion)
        if cut:
            span.add_event("cut")
        if status >= 500 or cut:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        span.end()


class Tracing:
    """The router's tracer: `begin` for every request on the path (None: not sampled)."""

    def __init__(self, endpoint: str, sample: float, service: str = "gpurouter") -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

        self.sample = sample
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("gpufleet.router")
        self._trace = trace
        self._remote = lambda t, s: trace.set_span_in_context(
            NonRecordingSpan(SpanContext(t, s, True, TraceFlags(TraceFlags.SAMPLED)))
        )
        self._server = SpanKind.SERVER
        self.random = random.random

    def begin(self, request, model: str, request_id: bytes) -> RequestTrace | None:
        forward = request.forward
        parent = None
        if TRACEPARENT in forward:
            line = header_line(forward)
            if line is not None:
                parent = parse_traceparent(forward[line[0] + len(TRACEPARENT) : line[1] - 2])
        if parent is not None:
            if not parent[2]:
                return None  # the client's decision: not sampled
            context = self._remote(parent[0], parent[1])
        elif self.random() < self.sample:
            context = None
        else:
            return None
        operation = OPERATIONS.get(request.path, "chat")
        span = self.tracer.start_span(
            f"{operation} {model}",
            context=context,
            kind=self._server,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.request.model": model,
                "gpufleet.request_id": request_id.decode(errors="replace"),
                "url.path": request.path.decode(errors="replace"),
            },
        )
        ids = span.get_span_context()
        header = b"traceparent: 00-%032x-%016x-01\r\n" % (ids.trace_id, ids.span_id)
        return RequestTrace(span, header)

    def close(self) -> None:
        self.provider.shutdown()

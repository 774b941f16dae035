"""The control plane's OpenTelemetry spans (`gpuctl server --otlp-endpoint`): one per tick
step that decided something, with what it decided, and one per API change (a POST, PUT or
DELETE), with its path and answer. Nothing here is imported without the flag.

A wait's trace: when a router's requests wait for a model (POST /v1/demand, carrying the
`traceparent` of one of them when it is traced), a `demand MODEL` span starts a trace of what
is done for that model, a child of the waiting request's span; each action a tick step then
decides about the model (placed, woken, its victims put to sleep or stopped to make room for
it, its events) is a span in that trace. The demand's answer gives the router the trace's id,
which every request parked for the model carries on its `parked` event: from a slow request,
one click shows why it waited. The trace stays the model's for as long as routers keep asking,
and ends once it has a ready replica or nobody asked for WAIT_TRACE_S.
"""

from __future__ import annotations

import time
from collections import Counter

WAIT_TRACE_S = 120.0  # a model's wait trace is taken up again by demands within this long


class ControlPlaneTracing:
    def __init__(self, endpoint: str, service: str = "gpuctl-server") -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind

        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("gpufleet.controlplane")
        self.server_kind = SpanKind.SERVER
        self.waits: dict[str, tuple[object, float]] = {}  # model -> (span context, last asked)

    def demand(self, model: str, traceparent: str | None, ready: bool) -> tuple[str, str]:
        """Requests wait for `model`: the ids of the trace of what is done for it and of its
        `demand` span (none once it has a ready replica), started here as a child of
        `traceparent` when there is none yet."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        now = time.monotonic()
        held = self.waits.get(model)
        if ready:
            self.waits.pop(model, None)
            return "", ""
        if held is not None and now - held[1] < WAIT_TRACE_S:
            self.waits[model] = (held[0], now)
            return _ids(held[0])
        carrier = {"traceparent": traceparent} if traceparent else {}
        span = self.tracer.start_span(
            f"demand {model}",
            context=TraceContextTextMapPropagator().extract(carrier),
            kind=self.server_kind,
            attributes={"gen_ai.request.model": model},
        )
        span.end()
        context = span.get_span_context()
        self.waits[model] = (context, now)
        return _ids(context)

    def step(self, name: str, actions: list, began_ns: int, model_of=None) -> None:
        """A tick step that decided `actions` (none: no span); `model_of(replica id)`: whose
        replica it is, to put each action about a waited-for model in that wait's trace."""
        if not actions:
            return
        if self.waits:
            self._in_waits(name, actions, began_ns, model_of)
        kinds = Counter(type(action).__name__ for action in actions)
        span = self.tracer.start_span(
            f"tick {name}",
            start_time=began_ns,
            attributes={
                "gpufleet.step": name,
                "gpufleet.actions": len(actions),
                **{f"gpufleet.actions.{kind}": n for kind, n in sorted(kinds.items())},
            },
        )
        for action in actions[:20]:
            span.add_event(type(action).__name__, _fields(action))
        span.end()

    def _in_waits(self, name: str, actions: list, began_ns: int, model_of) -> None:
        from opentelemetry.trace import NonRecordingSpan, set_span_in_context

        now = time.monotonic()
        for model, (_, asked) in list(self.waits.items()):
            if now - asked >= WAIT_TRACE_S:
                del self.waits[model]
        for action in actions:
            own = _model_of(action, model_of)
            about = {own}
            why = getattr(action, "why", None) or ""
            about.update(m for m in self.waits if f"room for {m}:" in why)  # its victims
            for model in about & self.waits.keys():
                span = self.tracer.start_span(
                    f"{type(action).__name__} {own or model}",
                    context=set_span_in_context(NonRecordingSpan(self.waits[model][0])),
                    start_time=began_ns,
                    attributes={"gpufleet.step": name, **_fields(action)},
                )
                span.end()

    def change(self, method: str, path: str, status: int, began_ns: int) -> None:
        span = self.tracer.start_span(
            f"{method} {path}",
            start_time=began_ns,
            kind=self.server_kind,
            attributes={
                "http.request.method": method,
                "url.path": path,
                "http.response.status_code": status,
            },
        )
        span.end()

    def close(self) -> None:
        self.provider.shutdown()


def _ids(context) -> tuple[str, str]:
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def _model_of(action, model_of) -> str | None:
    """The model an action is about: its own, or its replica's."""
    model = getattr(action, "model", None)
    if model:
        return model
    replica = getattr(action, "replica", None)
    if replica and model_of is not None:
        return model_of(replica)
    return None


def _fields(action) -> dict:
    """An action's fields as span attributes (strings, numbers and booleans only)."""
    out = {}
    for key, value in vars(action).items():
        if isinstance(value, bool | int | float | str):
            out[key] = value
        elif value is not None:
            out[key] = str(value)[:200]
    return out


def now_ns() -> int:
    return time.time_ns()

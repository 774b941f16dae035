"""The control plane's OpenTelemetry spans (`gpuctl server --otlp-endpoint`): one per tick
step that decided something, with what it decided, and one per API change (a POST, PUT or
DELETE), with its path and answer. Nothing here is imported without the flag."""

from __future__ import annotations

import time
from collections import Counter


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

    def step(self, name: str, actions: list, began_ns: int) -> None:
        """A tick step that decided `actions` (none: no span)."""
        if not actions:
            return
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

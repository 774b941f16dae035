"""The simulated engine's spans, as vLLM makes them with `--otlp-traces-endpoint`: one
`llm_request` span per request, the child of the `traceparent` it was sent (the router's
span), with the GenAI request and usage attributes."""

from __future__ import annotations

from contextlib import contextmanager


class EngineTracer:
    def __init__(self, endpoint: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = TracerProvider(resource=Resource.create({"service.name": "sim-engine"}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("gpufleet.sim")
        self.propagator = TraceContextTextMapPropagator()

    @contextmanager
    def request(self, headers, body: dict, max_tokens: int):
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract({k.lower(): v for k, v in headers.items()})
        with self.tracer.start_as_current_span(
            "llm_request",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.request.model": str(body.get("model")),
                "gen_ai.request.max_tokens": max_tokens,
                "gen_ai.usage.output_tokens": max_tokens,
            },
        ):
            yield

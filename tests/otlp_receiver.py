"""An OTLP/HTTP trace receiver on a loopback port, as a collector would be: it keeps every
span it is sent (protobuf or JSON, as OTLP/HTTP allows), decoded, for a test to read. With
`keep_alive` it keeps connections open between posts (HTTP/1.1), as collectors do, and notes
which client port each post came from."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, keep_alive: bool = False) -> None:
        from google.protobuf import json_format
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[dict] = []
        self.lock = threading.Lock()
        self.post_ports: list[int] = []  # each post's client port
        self.sockets: list = []  # each connection's, for drop_connections
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def setup(self):
                super().setup()
                receiver.sockets.append(self.connection)

            def do_POST(self):  # noqa: N802 (http.server's name)
                receiver.post_ports.append(self.client_address[1])
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.headers.get("content-type", "").startswith("application/json"):
                    message = json_format.Parse(_ids_as_base64(body), ExportTraceServiceRequest())
                else:
                    message = ExportTraceServiceRequest()
                    message.ParseFromString(body)
                receiver.take(message)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self, message) -> None:
        for resource_spans in message.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes
                 if a.key == "service.name"),
                "",
            )  # fmt: skip
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    with self.lock:
                        self.spans.append(
                            {
                                "service": service,
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_id": span.parent_span_id.hex(),
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "events": [e.name for e in span.events],
                                "links": [
                                    (link.trace_id.hex(), link.span_id.hex())
                                    for link in span.links
                                ],
                                "event_attributes": {
                                    e.name: {a.key: _value(a.value) for a in e.attributes}
                                    for e in span.events
                                },
                            }
                        )

    def of(self, service: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["service"] == service]

    def drop_connections(self) -> None:
        """Close every connection from this side, as a collector does with idle ones."""
        import socket

        for held in self.sockets:
            held.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value):
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _ids_as_base64(body: bytes) -> bytes:
    """OTLP/JSON writes trace and span ids in hex, where protobuf's JSON has base64."""
    import base64
    import json

    message = json.loads(body)
    for resource in message.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for held in (span, *span.get("links", [])):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if held.get(key):
                            held[key] = base64.b64encode(bytes.fromhex(held[key])).decode()
    return json.dumps(message).encode()

"""OpenTelemetry traces of requests: one span per request through the router, a child of the
client's (W3C `traceparent`), whose own context goes to the engine, so that a trace shows
client -> router -> engine (vLLM and SGLang continue it with `--otlp-traces-endpoint`).

Only with `gpurouter --otlp-endpoint URL` (the optional extra `gpufleet[otel]`): without it
this module imports nothing of OpenTelemetry and the request path makes no call here.

Sampling: a request that brings a `traceparent` follows its sampled flag (the client decided);
of those without, one in 1/`--trace-sample` is traced (a countdown drawn afresh each time, so
that periodic traffic is not sampled in step with it). An unsampled request costs the compiled
exchange a countdown and a look at the `traceparent` its reader kept
(router/protocol/forwarding.py's READ_BY_ROUTER); that header, if any, goes on to the engine
untouched.

The span is named as the GenAI semantic conventions name an inference span (`chat MODEL`),
with `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens` and
`output_tokens` (the engine's `usage`), `http.response.status_code`, and gpufleet's own
`gpufleet.tenant`, `gpufleet.replica`, `gpufleet.request_id`. Events: `parked` (why; on
release, how long), `picked` (which replica, its load, whether the engine reported it),
`retried` (why), `first_byte`, `cut` (the answer broke off).

A sampled request records its span as plain values on the request path; the event loop
writes them as OTLP/JSON from templates and posts them in batches (every 5 s, or 512 at a time)
to the collector (OTLP over HTTP, which every collector takes in JSON as in protobuf), on a
connection it keeps. Not through the OpenTelemetry SDK: its span and its encoder cost 45-70 µs
a span, measured, which at 1% sampling took 8% of the rate per core of a router that spends
19 µs a request; this way a span costs about 25 µs in all (about 8 on the request path, 17 to
encode and post). (The control plane and the simulated engine, whose rates are low, use the SDK.)
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

import orjson

log = logging.getLogger("gpurouter.tracing")

TRACEPARENT = b"traceparent: "
BATCH = 512  # spans a post
CHUNK = 32  # spans encoded between two turns of the event loop (about 0.3 ms)
EXPORT_EVERY_S = 5.0  # as the SDK's batch processor: fewer, larger posts
QUEUED_MOST = 20_000  # spans waiting to be posted; beyond, new ones are dropped (and counted)
POST_TIMEOUT_S = 10.0  # for the collector's answer to one post
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
    """Where the first `traceparent` line is among a request's forwarded header lines (their
    names are in lower case)."""
    if forward.startswith(TRACEPARENT):
        at = 0
    else:
        at = forward.find(b"\r\n" + TRACEPARENT)
        if at < 0:
            return None
        at += 2
    end = forward.find(b"\r\n", at)
    return (at, end + 2) if end >= 0 else None


class RequestTrace:
    """One sampled request's span, as plain values, filled in as the exchange reaches its
    points; `end` hands it to the exporter, which encodes it later. Its events are tuples,
    named first: ("parked", ns, why), ("picked", ns, replica, load, engine reported, attempt,
    seconds parked or -1), ("retried", ns, why), ("first_byte", ns), ("cut", ns)."""

    __slots__ = ("exporter", "trace_id", "span_id", "parent_id", "operation", "model",
                 "request_id", "path", "start_ns", "events", "traceparent", "parked_at",
                 "replica", "wake", "client_sent")  # fmt: skip

    def __init__(self, exporter, trace_id: int, span_id: int, parent_id: int, operation: str,
                 model: str, request_id: bytes, path: bytes,
                 client_sent: bool) -> None:  # fmt: skip
        """`client_sent`: the request brought a `traceparent` header (used or not), whose
        place this span's takes."""
        self.exporter = exporter
        self.trace_id, self.span_id, self.parent_id = trace_id, span_id, parent_id
        self.operation, self.model, self.request_id, self.path = operation, model, request_id, path
        self.start_ns = time.time_ns()
        self.events: list = []
        # The header the engine gets: this span as its parent.
        self.traceparent = b"traceparent: 00-%032x-%016x-01\r\n" % (trace_id, span_id)
        self.parked_at = 0.0
        self.replica = ""
        self.wake: tuple[str, str] | None = None  # the control plane's trace of this wait
        self.client_sent = client_sent

    def traceparent_value(self) -> str:
        return self.traceparent[len(TRACEPARENT) : -2].decode()

    def forward(self, forward: bytes) -> bytes:
        """The request's header lines with this span as the engine's parent (in place of any
        the client sent)."""
        if self.client_sent:
            line = header_line(forward)
            while line is not None:
                forward = forward[: line[0]] + forward[line[1] :]
                line = header_line(forward)
        return forward + self.traceparent

    def parked(self, why: str) -> None:
        self.parked_at = time.monotonic()
        self.events.append(("parked", time.time_ns(), why))

    def waited_on(self, trace_id: str, span_id: str) -> None:
        """The control plane's trace of placing or waking what this parked request waits for
        (its ids, in hex): named on the `parked` events and linked from this span."""
        self.wake = (trace_id, span_id)

    def picked(self, replica: str, load: int, reported: bool, attempt: int) -> None:
        parked_s = -1.0
        if self.parked_at:
            parked_s = time.monotonic() - self.parked_at
            self.parked_at = 0.0
        self.events.append(("picked", time.time_ns(), replica, load, reported, attempt, parked_s))
        self.replica = replica

    def retried(self, why: str) -> None:
        self.events.append(("retried", time.time_ns(), why))

    def first_byte(self) -> None:
        self.events.append(("first_byte", time.time_ns()))

    def end(self, status: int, tenant: str | None, prompt: int, completion: int, cut: bool):
        if cut:
            self.events.append(("cut", time.time_ns()))
        self.exporter.put((self, time.time_ns(), status, tenant, prompt, completion, cut))


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
        sent = request.traceparent  # kept by the request reader, as the headers it reads
        parent = None if sent is None else parse_traceparent(sent)
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
            sent is not None,
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

    async def close(self) -> None:
        await self.exporter.close()


class OtlpJsonExporter:
    """Spans posted as OTLP/JSON in batches, from the router's own event loop.

    Not from a thread: a thread that encodes and posts while the loop serves takes the GIL
    from it at every callback's edge, and the hand-overs cost more than the encoding (at 1%
    sampling, 3.4% of the rate per core with a thread; 1% on the loop, measured side by side
    with bench/compare_routers.py --traces --paired). The loop encodes a batch a few spans at
    a time, yielding between them, so no request waits behind more than CHUNK spans."""

    def __init__(self, endpoint: str, service: str, scope: str) -> None:
        parts = urlsplit(endpoint)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.path = parts.path or "/v1/traces"
        self.resource = orjson.dumps(
            {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]}
        )
        self.scope = orjson.dumps({"name": scope})
        self.head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        ).encode()
        self.queue: deque = deque()
        self.dropped = self.sent = self.failed = 0
        self.connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.timeout_s = POST_TIMEOUT_S
        self.full = asyncio.Event()  # the queue holds a batch: post it without waiting
        self.task: asyncio.Task | None = None  # waiting for a batch, or posting; None: idle
        self.closing = False

    def put(self, span: tuple) -> None:
        if len(self.queue) >= QUEUED_MOST:
            self.dropped += 1
            return
        self.queue.append(span)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._export())
        elif len(self.queue) == BATCH:
            self.full.set()

    async def _export(self) -> None:
        """Waits EXPORT_EVERY_S from the first span queued, or until a batch is queued, then
        posts what is queued."""
        try:
            try:
                await asyncio.wait_for(self.full.wait(), EXPORT_EVERY_S)
            except TimeoutError:
                pass
            await self._post_queued()
        finally:
            self.task = None
            self.full.clear()
            if self.queue and not self.closing:  # what came while posting: the next batch
                self.task = asyncio.get_running_loop().create_task(self._export())
                if len(self.queue) >= BATCH:
                    self.full.set()

    async def _post_queued(self) -> None:
        """What is queued now, in batches. What comes meanwhile waits for the next interval or
        batch: posting on until the queue is empty would, under load, post a few spans at a
        time back to back."""
        count = len(self.queue)
        while count > 0 and self.queue:
            batch = [self.queue.popleft() for _ in range(min(count, BATCH, len(self.queue)))]
            count -= len(batch)
            await self._post(batch)

    async def drain(self) -> None:
        while self.queue:
            batch = []
            while self.queue and len(batch) < BATCH:
                batch.append(self.queue.popleft())
            await self._post(batch)

    async def _post(self, batch: list) -> None:
        spans = []
        for start in range(0, len(batch), CHUNK):
            if start:
                await asyncio.sleep(0)
            spans += [_span(s) for s in batch[start : start + CHUNK]]
        body = b'{"resourceSpans":[{"resource":%s,"scopeSpans":[{"scope":%s,"spans":[%s]}]}]}' % (
            self.resource,
            self.scope,
            b",".join(spans),
        )
        try:
            status = await self._send(body)
            ok = 200 <= status < 300
            answer = f"HTTP {status}"
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            ok = False
            answer = repr(exc)
        if ok:
            self.sent += len(batch)
            return
        self.failed += len(batch)
        if self.failed == len(batch):  # the first failure is said; the rest are counted
            log.warning("traces could not be sent to %s: %s", self.host, answer)

    async def _send(self, body: bytes) -> int:
        """The collector's status for one post, on a connection kept between posts; one that
        the collector closed meanwhile is opened afresh, once."""
        while True:
            reused = self.connection is not None
            try:
                return await asyncio.wait_for(self._exchange(body), self.timeout_s)
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
                self._close_connection()
                # A collector that does not answer is not asked twice: the batch would wait
                # twice as long, and the post may have been taken.
                if reused and not isinstance(exc, TimeoutError):
                    continue
                raise

    async def _exchange(self, body: bytes) -> int:
        if self.connection is None:
            context = ssl.create_default_context() if self.https else None
            self.connection = await asyncio.open_connection(self.host, self.port, ssl=context)
        reader, writer = self.connection
        writer.write(self.head % len(body) + body)
        status, keep = await read_answer(reader)
        if not keep:
            self._close_connection()
        return status

    def _close_connection(self) -> None:
        if self.connection is not None:
            self.connection[1].close()
            self.connection = None

    async def close(self) -> None:
        """Posts what is queued (at most POST_TIMEOUT_S a post), then closes the connection."""
        self.closing = True
        if self.task is not None:
            self.full.set()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.drain()
        self._close_connection()


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """(status, whether the connection may be used again) of an HTTP/1.x answer, its body read
    to the end. ValueError for what is not HTTP."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    status = int(rest[:3])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    keep = headers.get("connection", "keep-alive" if version == "HTTP/1.1" else "close")
    if "chunked" in headers.get("transfer-encoding", ""):
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass  # trailers
    elif "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif status >= 200 and status not in (204, 304):
        await reader.read()  # the body ends with the connection
        return status, False
    return status, keep == "keep-alive"


# OTLP/JSON, written from templates: the keys and the fixed attributes' names are constant
# bytes, and only the values are formatted in (as OTLP/JSON has them: 64-bit integers as
# strings, ids in hex). Kind 2 is SPAN_KIND_SERVER.
SPAN = (
    b'{"traceId":"%032x","spanId":"%016x"%s,"name":%s,"kind":2,"startTimeUnixNano":"%d",'
    b'"endTimeUnixNano":"%d","attributes":['
    b'{"key":"gen_ai.operation.name","value":{"stringValue":%s}},'
    b'{"key":"gen_ai.request.model","value":{"stringValue":%s}},'
    b'{"key":"gpufleet.request_id","value":{"stringValue":%s}},'
    b'{"key":"url.path","value":{"stringValue":%s}},'
    b'{"key":"http.response.status_code","value":{"intValue":"%d"}}%s],"events":[%s]%s}'
)
STRING = b',{"key":"%s","value":{"stringValue":%s}}'
INT = b',{"key":"%s","value":{"intValue":"%d"}}'
PICKED = (
    b'{"name":"picked","timeUnixNano":"%d","attributes":['
    b'{"key":"gpufleet.replica","value":{"stringValue":%s}},'
    b'{"key":"gpufleet.replica.load","value":{"intValue":"%d"}},'
    b'{"key":"gpufleet.load.engine_reported","value":{"boolValue":%s}},'
    b'{"key":"gpufleet.attempt","value":{"intValue":"%d"}}%s]}'
)
PARKED_S = b',{"key":"gpufleet.parked_s","value":{"doubleValue":%s}}'
WITH_REASON = (
    b'{"name":"%s","timeUnixNano":"%d","attributes":['
    b'{"key":"reason","value":{"stringValue":%s}}%s]}'
)
BARE = b'{"name":"%s","timeUnixNano":"%d","attributes":[]}'
TEXTS: dict = {}  # a repeated string (model, replica, path, reason, tenant) -> its JSON
TEXTS_MOST = 8192


def _text(value: str) -> bytes:
    """A string as JSON; the repeated ones encoded once (on the event loop alone: no
    lock), until the cache is full."""
    found = TEXTS.get(value)
    if found is None:
        found = orjson.dumps(value)
        if len(TEXTS) < TEXTS_MOST:
            TEXTS[value] = found
    return found


def _event(event: tuple, woke: bytes) -> bytes:
    name = event[0]
    if name == "picked":
        _, at, replica, load, reported, attempt, parked_s = event
        waited = b"" if parked_s < 0 else PARKED_S % orjson.dumps(parked_s)
        return PICKED % (
            at, _text(replica), load, b"true" if reported else b"false", attempt, waited
        )  # fmt: skip
    if name == "parked":
        return WITH_REASON % (b"parked", event[1], _text(event[2]), woke)
    if name == "retried":
        return WITH_REASON % (b"retried", event[1], _text(event[2]), b"")
    return BARE % (name.encode(), event[1])


def _span(ended: tuple) -> bytes:
    """A span as OTLP/JSON (`ended`: what RequestTrace.end handed the exporter)."""
    trace, end, status, tenant, prompt, completion, cut = ended
    more = b""
    if trace.replica:
        more += STRING % (b"gpufleet.replica", _text(trace.replica))
    if tenant:
        more += STRING % (b"gpufleet.tenant", _text(tenant))
    if prompt >= 0:
        more += INT % (b"gen_ai.usage.input_tokens", prompt)
    if completion >= 0:
        more += INT % (b"gen_ai.usage.output_tokens", completion)
    woke = tail = b""
    if trace.wake is not None:
        wake_trace, wake_span = orjson.dumps(trace.wake[0]), orjson.dumps(trace.wake[1])
        woke = STRING % (b"gpufleet.wake.trace_id", wake_trace)
        tail = b',"links":[{"traceId":%s,"spanId":%s}]' % (wake_trace, wake_span)
    if status >= 500 or cut:
        tail = b',"status":{"code":%d}' % STATUS_ERROR + tail
    return SPAN % (
        trace.trace_id, trace.span_id,
        b',"parentSpanId":"%016x"' % trace.parent_id if trace.parent_id else b"",
        _text(f"{trace.operation} {trace.model}"), trace.start_ns, end,
        _text(trace.operation), _text(trace.model),
        orjson.dumps(trace.request_id.decode(errors="replace")),
        _text(trace.path.decode(errors="replace")), status, more,
        b",".join([_event(e, woke) for e in trace.events]), tail,
    )  # fmt: skip

"""The client side of gpurouter: parse requests with httptools, pick a replica, relay the answer.

Each `ClientConnection` answers its requests one at a time (pipelined ones wait their turn).
An inference request becomes an `Exchange`: acquire a slot in the EndpointTable, send the
request over a pooled upstream connection, relay the response as it arrives, release the slot.
Deadlines are checked by one sweep a second for all connections (`ProxyContext.sweep`), so
the per-request path sets no timers.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import os
import socket
import time
from collections import deque
from dataclasses import dataclass

import httptools
import orjson

from router.activity import activity_report
from router.errors import REASONS, error_body, sse_error_event
from router.fastpath import NO_ENDPOINT, NO_MODEL, SATURATED
from router.metrics import RouterMetrics
from router.upstream import UpstreamConnection, UpstreamPool

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-connection",
    }
)
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"x-forwarded-for", b"x-request-id"}
NOT_RELAYED = HOP_BY_HOP | {b"content-length", b"x-request-id"}
JSON = b"application/json"
CHUNK_END = b"0\r\n\r\n"


@dataclass
class ProxyConfig:
    max_body_bytes: int = 32 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 600.0  # prefill of a long prompt can take minutes
    idle_timeout_s: float = 120.0  # between two chunks of an answer
    client_timeout_s: float = 30.0  # to send the request's headers and body
    keepalive_timeout_s: float = 75.0
    max_tries: int = 3
    api_keys: tuple[bytes, ...] = ()


class RequestRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ProxyContext:
    """What every connection of one router process shares."""

    def __init__(
        self,
        table,
        config: ProxyConfig,
        metrics: RouterMetrics | None = None,
        router_id: str = "",
        started: float = 0.0,
    ) -> None:
        self.table = table
        self.router_id = router_id
        self.started = started or time.monotonic()
        self.config = config
        self.metrics = metrics or RouterMetrics()
        self.pools: dict[str, UpstreamPool] = {}
        self.connections: set[ClientConnection] = set()
        self.loop = asyncio.get_event_loop()
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}-{os.urandom(3).hex()}-"

    def new_request_id(self) -> bytes:
        return (self._id_prefix + str(next(self._ids))).encode()

    def pool_for(self, url: str) -> UpstreamPool:
        pool = self.pools.get(url)
        if pool is None:
            pool = self.pools[url] = UpstreamPool(url, self.config.connect_timeout_s)
        return pool

    def drop_unused_pools(self) -> None:
        """Close pools of endpoints no longer in the table (once a tick, not per request)."""
        live = {url for model in self.table.models() for _, _, url in self.table.endpoints(model)}
        for url in list(self.pools):
            if url not in live and not self.pools[url].busy():
                self.pools.pop(url).close()

    def sweep(self) -> None:
        now = self.loop.time()
        for conn in list(self.connections):
            conn.check_deadlines(now)

    def in_flight(self) -> int:
        return sum(1 for conn in self.connections if conn.exchange is not None)

    def authorised(self, headers: dict) -> bool:
        if not self.config.api_keys:
            return True
        given = headers.get(b"authorization", b"")
        if not given.startswith(b"Bearer "):
            return False
        token = given[7:].strip()
        return any(hmac.compare_digest(token, key) for key in self.config.api_keys)


class ClientConnection(asyncio.Protocol):
    def __init__(self, ctx: ProxyContext) -> None:
        self.ctx = ctx
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer = b""
        self.pending: deque = deque()
        self.exchange: Exchange | None = None
        self.closed = False
        self.reading_since = 0.0
        self.idle_since = ctx.loop.time()
        self.keep_alive = True
        self.max_header_bytes = ctx.config.max_header_bytes  # read per header: kept at hand
        self.max_body_bytes = ctx.config.max_body_bytes
        self._reset_request()

    def _reset_request(self) -> None:
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.header_list: list = []
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_bytes = 0

    # asyncio callbacks

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = peer[0].encode() if peer else b""
        self.ctx.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except RequestRefused as refusal:
            self.refuse_and_close(refusal.status, str(refusal))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, RequestRefused):
                self.refuse_and_close(cause.status, str(cause))
            else:
                self.refuse_and_close(400, "malformed HTTP request")
        except httptools.HttpParserUpgrade:
            self.refuse_and_close(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self.refuse_and_close(400, f"malformed HTTP request: {exc}")
        else:
            # Requests are answered once the parser is done with this read, never from
            # inside its callbacks.
            if self.exchange is None and self.pending:
                self.next_request()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.ctx.connections.discard(self)
        if self.exchange is not None:
            self.exchange.client_gone()

    def pause_writing(self) -> None:
        if self.exchange is not None and self.exchange.upstream is not None:
            self.exchange.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.exchange is not None and self.exchange.upstream is not None:
            self.exchange.upstream.resume_reading()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._reset_request()
        self.reading_since = self.ctx.loop.time()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.header_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > self.max_header_bytes:
            raise RequestRefused(431, "request headers are too large")
        name = name.lower()
        self.header_list.append((name, value))
        self.headers[name] = value

    def on_headers_complete(self) -> None:
        length = self.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise RequestRefused(413, "request body is too large")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            raise RequestRefused(413, "request body is too large")
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.reading_since = 0.0
        request = (
            self.parser.get_method(),
            self.url,
            self.headers,
            self.header_list,
            b"".join(self.body),
            self.parser.should_keep_alive(),
        )
        self.pending.append(request)
        if len(self.pending) > 8:
            self.transport.pause_reading()

    # answering

    def next_request(self) -> None:
        if self.closed or self.exchange is not None or not self.pending:
            return
        method, url, headers, header_list, body, keep_alive = self.pending.popleft()
        self.keep_alive = keep_alive
        request_id = headers.get(b"x-request-id") or self.ctx.new_request_id()
        path = url.split(b"?", 1)[0]
        if path == b"/healthz":
            return self.respond(200, b'{"status":"ok"}', request_id=request_id)
        if path == b"/metrics":
            table = self.ctx.table
            endpoints = sum(len(table.endpoints(m)) for m in table.models())
            text = self.ctx.metrics.render(table.ejections_total, endpoints)
            return self.respond(
                200, text, content_type=b"text/plain; version=0.0.4", request_id=request_id
            )
        if path == b"/activity":
            report = activity_report(self.ctx.router_id, self.ctx.started, self.ctx.table)
            return self.respond(200, orjson.dumps(report), request_id=request_id)
        if not self.ctx.authorised(headers):
            return self.respond_error(
                401, "invalid or missing API key", request_id, code="invalid_api_key"
            )
        if path.startswith(b"/v1/models") and method == b"GET":
            return self.list_models(path, request_id)
        if not path.startswith(b"/v1/"):
            return self.respond_error(
                404, f"no route for {path.decode(errors='replace')}", request_id
            )
        if method != b"POST":
            return self.respond_error(405, "use POST for this path", request_id)
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self.respond_error(400, "the body is not valid JSON", request_id)
        model = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(model, str) or not model:
            return self.respond_error(400, "the body has no `model`", request_id, param="model")
        exchange = Exchange(self, model, method, url, header_list, headers, body, request_id)
        self.exchange = exchange
        self.ctx.metrics.in_flight += 1
        exchange.start()

    def list_models(self, path: bytes, request_id: bytes) -> None:
        names = self.ctx.table.models()
        cards = [{"id": n, "object": "model", "created": 0, "owned_by": "gpufleet"} for n in names]
        if path.rstrip(b"/") == b"/v1/models":
            return self.respond(
                200, orjson.dumps({"object": "list", "data": cards}), request_id=request_id
            )
        wanted = path[len(b"/v1/models/") :].decode(errors="replace")
        for card in cards:
            if card["id"] == wanted:
                return self.respond(200, orjson.dumps(card), request_id=request_id)
        self.respond_error(
            404, f"The model `{wanted}` does not exist.", request_id, code="model_not_found"
        )

    def respond_error(
        self,
        status: int,
        message: str,
        request_id: bytes,
        code=None,
        param=None,
        extra: bytes = b"",
    ) -> None:
        self.respond(
            status, error_body(status, message, code, param), request_id=request_id, extra=extra
        )

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON,
        request_id: bytes = b"",
        extra: bytes = b"",
    ) -> None:
        if self.closed:
            return
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
            status,
            REASONS.get(status, b"Unknown"),
            content_type,
            len(body),
        )
        if request_id:
            head += b"x-request-id: " + request_id + b"\r\n"
        if not self.keep_alive:
            head += b"connection: close\r\n"
        self.transport.write(head + extra + b"\r\n" + body)
        self.request_done()

    def request_done(self) -> None:
        self.exchange = None
        self.idle_since = self.ctx.loop.time()
        if not self.keep_alive:
            self.close()
            return
        if self.pending:
            self.transport.resume_reading()
            self.next_request()

    def refuse_and_close(self, status: int, message: str) -> None:
        if self.closed:
            return
        self.keep_alive = False
        self.pending.clear()
        if self.exchange is None:
            self.respond_error(status, message, b"")
        else:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def check_deadlines(self, now: float) -> None:
        config = self.ctx.config
        if self.exchange is not None:
            self.exchange.check_deadline(now)
        elif self.reading_since and now - self.reading_since > config.client_timeout_s:
            self.keep_alive = False
            self.respond_error(408, "the request was not received in time", b"")
        elif not self.pending and now - self.idle_since > config.keepalive_timeout_s:
            self.close()


class Exchange:
    """One inference request on its way through a replica and back."""

    __slots__ = (
        "client",
        "ctx",
        "model",
        "method",
        "url",
        "header_list",
        "headers",
        "body",
        "request_id",
        "started",
        "slot",
        "upstream",
        "tries",
        "sent_to_client",
        "chunked",
        "sse",
        "status",
        "deadline",
        "done",
        "outgoing",
        "pool",
        "stale_retried",
    )

    def __init__(self, client, model, method, url, header_list, headers, body, request_id):
        self.client = client
        self.ctx = client.ctx
        self.model = model
        self.method = method
        self.url = url
        self.header_list = header_list
        self.headers = headers
        self.body = body
        self.request_id = request_id
        self.started = self.ctx.loop.time()
        self.slot = -1
        self.upstream: UpstreamConnection | None = None
        self.tries = 0
        self.sent_to_client = False
        self.chunked = False
        self.sse = False
        self.status = 0
        self.deadline = 0.0
        self.done = False
        self.outgoing: list[bytes] = []
        self.pool: UpstreamPool | None = None
        self.stale_retried = False

    def start(self) -> None:
        table = self.ctx.table
        slot = table.acquire(self.model)
        if slot < 0:
            return self.refuse_unroutable(slot)
        self.slot = slot
        self.tries += 1
        pool = self.ctx.pool_for(table.endpoint_url(slot))
        conn = pool.take_idle(self.ctx.loop.time())
        if conn is not None:
            self.attach(conn, pool)
        else:
            self.ctx.loop.create_task(self.connect(pool))

    def refuse_unroutable(self, result: int) -> None:
        if result == NO_MODEL:
            self.finish_with_error(
                404, f"The model `{self.model}` does not exist.", code="model_not_found"
            )
        elif result in (NO_ENDPOINT, SATURATED):
            why = "is saturated" if result == SATURATED else "has no ready replica"
            self.finish_with_error(
                503, f"model `{self.model}` {why}; retry later", extra=b"retry-after: 1\r\n"
            )

    async def connect(self, pool: UpstreamPool) -> None:
        try:
            conn = await pool.connect()
        except (TimeoutError, OSError) as exc:
            kind = "connect_timeout" if isinstance(exc, asyncio.TimeoutError) else "connect_error"
            return self.failed_before_answer(kind)
        if self.done:
            pool.put_back(conn)
            return
        self.attach(conn, pool)

    def attach(self, conn: UpstreamConnection, pool: UpstreamPool) -> None:
        self.upstream = conn
        self.pool = pool
        self.deadline = self.ctx.loop.time() + self.ctx.config.first_byte_timeout_s
        conn.send(self, self.request_bytes(pool))

    def request_bytes(self, pool: UpstreamPool) -> bytes:
        parts = [
            self.method,
            b" ",
            pool.path_prefix + self.url,
            b" HTTP/1.1\r\nhost: ",
            pool.host_header,
            b"\r\n",
        ]
        # Headers the client's Connection header names are hop-by-hop too (RFC 9110 7.6.1).
        connection = self.headers.get(b"connection")
        named = {t.strip().lower() for t in connection.split(b",")} if connection else ()
        for name, value in self.header_list:
            if name not in NOT_FORWARDED and name not in named:
                parts += (name, b": ", value, b"\r\n")
        forwarded = self.headers.get(b"x-forwarded-for")
        peer = self.client.peer
        parts += (
            b"x-forwarded-for: ",
            forwarded + b", " + peer if forwarded else peer,
            b"\r\nx-request-id: ",
            self.request_id,
            b"\r\ncontent-length: %d\r\n\r\n" % len(self.body),
            self.body,
        )
        return b"".join(parts)

    # ResponseListener: what one read from the replica produced is written to the client in
    # one go (flush), so a small answer costs one send, not one per header block and chunk.

    def flush(self) -> None:
        if self.outgoing:
            if not self.client.closed:
                self.client.transport.write(b"".join(self.outgoing))
            self.outgoing.clear()

    def upstream_headers(self, status: int, reason: bytes, headers: list) -> None:
        now = self.ctx.loop.time()
        self.ctx.metrics.first_byte_after(self.model, now - self.started)
        self.deadline = now + self.ctx.config.idle_timeout_s
        self.status = status
        has_length = False
        out = [b"HTTP/1.1 %d " % status, reason or REASONS.get(status, b""), b"\r\n"]
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                has_length = True
                out += (b"content-length: ", value, b"\r\n")
            elif lower not in NOT_RELAYED:
                if lower == b"content-type" and value.startswith(b"text/event-stream"):
                    self.sse = True
                out += (name, b": ", value, b"\r\n")
        self.chunked = not has_length
        if self.chunked:
            out.append(b"transfer-encoding: chunked\r\n")
        if not self.client.keep_alive:
            out.append(b"connection: close\r\n")
        out += (b"x-request-id: ", self.request_id, b"\r\n\r\n")
        self.sent_to_client = True
        self.outgoing.append(b"".join(out))

    def upstream_body(self, data: bytes) -> None:
        self.deadline = self.ctx.loop.time() + self.ctx.config.idle_timeout_s
        if self.chunked:
            self.outgoing.append(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self.outgoing.append(data)

    def upstream_complete(self, reusable: bool) -> None:
        self.upstream = None
        if self.chunked:
            self.outgoing.append(CHUNK_END)
        self.flush()
        self.finish(failed=self.status >= 500)

    def upstream_lost(self, reason: str, reused: bool) -> None:
        self.upstream = None
        if self.done:
            return
        if not self.sent_to_client and reused and not self.stale_retried:
            # A pooled connection the replica had just closed: not the replica's fault. Once,
            # the same replica again on a new connection.
            self.stale_retried = True
            self.ctx.metrics.upstream_error(self.model, "stale_connection")
            self.ctx.loop.create_task(self.connect(self.pool))
            return
        if not self.sent_to_client:
            return self.failed_before_answer("reset")
        self.ctx.metrics.upstream_error(self.model, "lost_mid_answer")
        self.end_broken_answer(f"the replica closed the connection mid-answer ({reason})")

    def failed_before_answer(self, kind: str) -> None:
        """Nothing reached the client yet: count the failure and try another replica."""
        if self.done:
            return
        self.ctx.metrics.upstream_error(self.model, kind)
        self.ctx.table.release(self.slot, True)
        self.slot = -1
        if self.tries < self.ctx.config.max_tries:
            self.ctx.metrics.retries += 1
            return self.start()
        self.finish_with_error(502, f"no replica of `{self.model}` answered ({kind})")

    def end_broken_answer(self, message: str) -> None:
        if self.sse and self.chunked:
            event = sse_error_event(message)
            self.outgoing.append(b"%x\r\n%s\r\n%s" % (len(event), event, CHUNK_END))
            self.flush()
            self.finish(failed=True)
        else:
            # The client learns from the cut connection: a body cannot carry an error now.
            self.flush()
            self.client.keep_alive = False
            self.finish(failed=True)

    def check_deadline(self, now: float) -> None:
        if self.done or self.upstream is None or not self.deadline or now < self.deadline:
            return
        upstream, self.upstream = self.upstream, None
        upstream.detach()
        self.ctx.metrics.upstream_error(self.model, "timeout")
        if self.sent_to_client:
            self.end_broken_answer("the replica stopped sending")
        else:
            self.ctx.table.release(self.slot, True)
            self.slot = -1
            self.finish_with_error(504, f"the replica of `{self.model}` did not answer in time")

    def client_gone(self) -> None:
        if self.done:
            return
        if self.upstream is not None:
            upstream, self.upstream = self.upstream, None
            upstream.detach()
        self.status = 499
        self.finish(failed=False)

    def finish_with_error(self, status: int, message: str, code=None, extra: bytes = b"") -> None:
        self.status = status
        self.finish(failed=False, answered=False)
        self.client.respond_error(status, message, self.request_id, code=code, extra=extra)

    def finish(self, failed: bool, answered: bool = True) -> None:
        if self.done:
            return
        self.done = True
        if self.slot >= 0:
            self.ctx.table.release(self.slot, failed)
            self.slot = -1
        metrics = self.ctx.metrics
        metrics.in_flight -= 1
        metrics.finished(self.model, self.status, self.ctx.loop.time() - self.started)
        if answered and not self.client.closed:
            self.client.request_done()

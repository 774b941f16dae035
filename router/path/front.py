"""The HTTP front of gpurouter: read requests (`router.protocol.wire`: llhttp, limits enforced as
they arrive), check API keys, answer the router's own endpoints, and hand each inference request to
an `Exchange`.

Each `ClientConnection` answers its requests one at a time (pipelined ones wait their turn).
Deadlines are checked by one sweep a second for all connections (`ProxyContext.sweep`), so
the per-request path sets no timers.
"""

from __future__ import annotations

import asyncio
import math
import socket

import orjson

from router.control.resolvers import served
from router.path import affinity, target
from router.path.affinity import OFF
from router.path.context import ProxyContext
from router.path.exchange import ClientSide, Exchange
from router.path.sender import Sender
from router.path.target import Refusal
from router.protocol.errors import REASONS, RequestRefused, error_body
from router.protocol.wire import RequestReader, monotonic
from router.telemetry.metrics import OTHER_MODEL
from router.tenancy.tenants import (
    BAD_BOUND,
    LIMIT_NAMES,
    NO_BOUND,
    completion_bound,
    tokens_asked,
)

JSON = b"application/json"
PROMETHEUS_TEXT = b"text/plain; version=0.0.4"
MAX_PIPELINED = 8
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# A request's reading time starts at the first deadline sweep (once a second) after it began,
# not with a clock read per request: a slow client is cut within client_timeout_s plus one
# sweep.
STAMP_AT_SWEEP = -1.0


class ClientConnection(ClientSide):
    """An asyncio protocol (by its methods: a compiled class cannot derive from
    asyncio.Protocol); attributes and C-level methods are typed in front.pxd."""

    def __init__(self, ctx: ProxyContext) -> None:
        self.ctx = ctx
        self.transport: asyncio.Transport | None = None
        self.out: Sender | None = None
        self.peer = b""
        self.pending: list = []  # requests read whole, waiting their turn (a few at most)
        config = ctx.config
        self.reader = RequestReader(self.pending, config.max_header_bytes, config.max_body_bytes)
        self.exchange: Exchange | None = None
        self.closed = False
        # The transport asked to stop writing (a slow client): an exchange that starts meanwhile
        # pauses its replica's connection from its first read, as asyncio tells us only once.
        self.writing_paused = False
        self.idle_since = ctx.clock()
        self.keep_alive = True
        self.reading_since = 0.0  # none is being read yet

    # asyncio callbacks

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.out = Sender(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = peer[0].encode() if peer else b""
        self.ctx.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            completed = self.reader.feed(data)
        except RequestRefused as refusal:
            self.refuse_and_close(refusal.status, str(refusal))
            return
        if not self.reader.mid_message:
            self.reading_since = 0.0
        elif completed or self.reading_since == 0.0:
            self.reading_since = STAMP_AT_SWEEP  # a request began in this read
        if completed and len(self.pending) > MAX_PIPELINED:
            self.transport.pause_reading()
        if self.reader.continue_wanted and self.exchange is None and not self.pending:
            self.send_continue()
        # Requests are answered once the reader is done with this read.
        if self.exchange is None and self.pending:
            self.next_request()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.ctx.connections.discard(self)
        if self.exchange is not None:
            self.exchange.client_gone()

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.exchange is not None:
            self.exchange.pause_upstream()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.exchange is not None:
            self.exchange.resume_upstream()

    # answering

    def next_request(self) -> None:
        if self.closed or self.exchange is not None or not self.pending:
            return
        request = self.pending[0]
        # Not pop(0): on a list of one, compiled, that is a call by name (Cython's fast pop
        # wants the list more than half full).
        del self.pending[0]
        method = request.method
        self.keep_alive = request.keep_alive
        ctx = self.ctx
        request_id = request.x_request_id or ctx.new_request_id()
        path = request.path
        if path.startswith(b"/v1/"):
            tenant = None
            if ctx.keys_required:
                tenant = ctx.tenants.find(request.authorization)
                if tenant is None:
                    self.respond_error(
                        401, "invalid or missing API key", request_id, code="invalid_api_key"
                    )
                    return
            if method == b"GET" and path.startswith(b"/v1/models"):
                self.list_models(path, request_id, tenant)
                return
            try:
                routed = target.target_of(request)
            except Refusal as refusal:
                self.respond_error(
                    refusal.status, str(refusal), request_id, refusal.code, refusal.param
                )
                return
            reserved = 0.0
            refused = 0
            if tenant is not None:
                if tenant.patterns and not tenant.may_call(routed[0]):
                    # The same answer as a model that does not exist: which exist is not told.
                    self.respond_error(
                        404,
                        f"The model `{routed[0]}` does not exist.",
                        request_id,
                        code="model_not_found",
                    )
                    return
                if tenant.tokens_per_minute:
                    bound = completion_bound(routed[2])
                    if bound == BAD_BOUND:
                        self.respond_error(
                            400,
                            "`max_completion_tokens` and `max_tokens` take a whole number of"
                            " tokens, 0 or more",
                            request_id,
                            code="invalid_value",
                            param="max_tokens",
                        )
                        return
                    if bound == NO_BOUND:
                        bound = tenant.default_max_tokens
                        if routed[2] is not None:
                            request.bound_completion(bound)
                    reserved = tokens_asked(len(request.body), bound)
                    if reserved > tenant.tokens_per_minute:
                        self.refuse_beyond_a_minute(tenant, reserved, routed[0], request_id)
                        return
                now = monotonic()
                refused = tenant.admit(now, reserved, now < ctx.tenants.lease_until)
                if refused and not (ctx.shares_grow and tenant.may_wait(refused)):
                    self.refuse_over_limit(tenant, refused, routed[0], request_id)
                    return
            mode = ctx.affinity_by_model.get(routed[0], ctx.affinity)
            key = 0
            if mode != OFF:
                key = affinity.affinity_key(
                    routed[2], request.x_session_id, mode, ctx.affinity_prefix_chars
                )
            exchange = Exchange.__new__(Exchange)
            exchange.begin(self, routed, request, request_id, key, tenant, reserved)
            self.exchange = exchange
            ctx.metrics.in_flight += 1
            if refused:  # over this router's share, which the control plane may grow
                exchange.wait_for_share(refused)
            else:
                exchange.start()
            return
        self.serve_own_endpoint(path, request.authorization, request_id)

    def serve_own_endpoint(self, path: bytes, authorization: bytes, request_id: bytes) -> None:
        if path == b"/healthz":
            self.respond(200, b'{"status":"ok"}', request_id)
            return
        if path in (b"/metrics", b"/activity") and not self.ctx.may_read_metrics(authorization):
            self.respond_error(
                401,
                "this router's metrics need its metrics token (gpurouter --metrics-token)",
                request_id,
                code="invalid_api_key",
            )
            return
        if path == b"/metrics":
            text = self.ctx.metrics_text()
            self.respond(200, text, request_id, content_type=PROMETHEUS_TEXT)
            return
        if path == b"/activity":
            if not self.ctx.config.metrics_token and not self.ctx.authorised(authorization):
                self.respond_error(
                    401, "invalid or missing API key", request_id, code="invalid_api_key"
                )
                return
            self.respond(200, orjson.dumps(self.ctx.activity()), request_id)
            return
        self.respond_error(404, f"no route for {path.decode(errors='replace')}", request_id)

    def refuse_beyond_a_minute(self, tenant, reserved: int, model: str, request_id: bytes) -> None:
        """429 at once: no wait would let this request in, its estimate being more than the
        tenant's whole minute of tokens."""
        label = model if model in self.ctx.routed_models else OTHER_MODEL
        tenant.count(label, 429, 0, 0, True, 0.0)
        message = (
            f"Request too large for tenant {tenant.name}: it may use {reserved} tokens (its"
            f" prompt and max_tokens), more than its {int(tenant.tokens_per_minute)} tokens per"
            " minute; lower max_tokens or max_completion_tokens."
        )
        self.respond(429, error_body(429, message, "rate_limit_exceeded"), request_id,
                     tenant.limit_headers())  # fmt: skip

    def refuse_over_limit(self, tenant, refused: int, model: str, request_id: bytes) -> None:
        """429 as OpenAI answers it: which limit, when to retry, and the limits' headers."""
        retry = tenant.retry_after(refused)
        label = model if model in self.ctx.routed_models else OTHER_MODEL
        tenant.count(label, 429, 0, 0, True, 0.0)
        what = LIMIT_NAMES[refused]
        message = f"Rate limit reached for tenant {tenant.name} on {what}; retry in {retry:.3g}s."
        extra = b"retry-after: %d\r\n" % max(1, math.ceil(retry)) + tenant.limit_headers()
        self.respond(429, error_body(429, message, "rate_limit_exceeded"), request_id, extra)

    def list_models(self, path: bytes, request_id: bytes, tenant=None) -> None:
        cards = self.ctx.catalog.cards(served(self.ctx.table.models()))
        if tenant is not None and tenant.patterns:
            cards = [card for card in cards if tenant.may_call(card["id"])]
        if path.rstrip(b"/") == b"/v1/models":
            self.respond(200, orjson.dumps({"object": "list", "data": cards}), request_id)
            return
        wanted = path[len(b"/v1/models/") :].decode(errors="replace")
        for card in cards:
            if card["id"] == wanted:
                self.respond(200, orjson.dumps(card), request_id)
                return
        self.respond_error(
            404, f"The model `{wanted}` does not exist.", request_id, code="model_not_found"
        )

    def respond_error(self, status, message, request_id, code=None, param=None) -> None:
        self.respond(status, error_body(status, message, code, param), request_id)

    def respond(
        self,
        status: int,
        body: bytes,
        request_id: bytes = b"",
        extra: bytes = b"",
        content_type: bytes = JSON,
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
        self.out.write(head + extra + b"\r\n" + body)
        self.request_done(self.ctx.clock())

    def request_done(self, now: float) -> None:
        self.exchange = None
        self.idle_since = now
        if not self.keep_alive:
            self.close()
            return
        if self.pending:
            self.transport.resume_reading()
            self.next_request()
        elif self.reader.continue_wanted:
            self.send_continue()

    def send_continue(self) -> None:
        """The request being read asked to hear that its body is wanted before it sends it:
        it is next in line, so it is (the router reads every body whole)."""
        self.reader.continue_wanted = False
        self.out.write(CONTINUE)

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
        elif self.reading_since == STAMP_AT_SWEEP:
            self.reading_since = now
        elif self.reading_since and now - self.reading_since > config.client_timeout_s:
            self.keep_alive = False
            self.respond_error(408, "the request was not received in time", b"")
        elif not self.pending and now - self.idle_since > config.keepalive_timeout_s:
            self.close()

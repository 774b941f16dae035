"""One request on its way through a replica and back, as an explicit state machine.

    PICK ──► CONNECT ──► SEND ──► RELAY ──► DONE
     │ ▲        │ ▲       │ │
     │ └────────┘ └───────┘ │      a failure before the answer's head: PICK again (another
     ▼                      │      replica) or, for a pooled connection the replica had just
    WAITING ──► PICK        │      closed, CONNECT again (the same replica, once)
     └──────────────────────┴────► DONE from any state

`MOVES` is the whole table; a move not in it raises `LifecycleError`. Every event that comes
from outside (the upstream connection, the connect task, the deadline sweep, the client going
away) catches whatever it raises, so that no path ends without `_finish`: the one place that
releases the slot, counts the request and answers the client.
"""

from __future__ import annotations

import asyncio
import logging
import math
from enum import IntEnum

from router.path.fastpath import NO_ENDPOINT, NO_MODEL, SATURATED
from router.path.upstream import ResponseListener, UpstreamConnection, UpstreamPool
from router.protocol.errors import error_body, sse_error_event
from router.protocol.forwarding import CHUNK_END, CONNECTION_WITHOUT_NAMES
from router.protocol.wire import monotonic, usage_tokens
from router.telemetry.metrics import OTHER_MODEL
from router.tenancy.tenants import (
    BYTES_PER_TOKEN,
    LIMIT_NAMES,
    SHARE_WAIT_S,
)

log = logging.getLogger("gpurouter.exchange")


class Stage(IntEnum):
    PICK = 0  # choosing a replica
    WAITING = 1  # no replica can take it now
    CONNECT = 2  # opening a connection to the replica
    SEND = 3  # request sent, waiting for the answer's head
    RELAY = 4  # the answer is on its way to the client
    DONE = 5


PICK, WAITING, CONNECT, SEND, RELAY, DONE = Stage


def _moves(table: dict) -> tuple[int, ...]:
    # A bit mask per state, indexed by the state: checking a move costs no hashing of enums.
    return tuple(sum(1 << to for to in table[stage]) for stage in Stage)


MOVES = {
    PICK: (WAITING, CONNECT, SEND, DONE),
    WAITING: (PICK, DONE),
    CONNECT: (SEND, PICK, DONE),
    SEND: (RELAY, CONNECT, PICK, DONE),
    RELAY: (DONE,),
    DONE: (),
}
_ALLOWED = _moves(MOVES)

# A relayed answer's deadline is renewed by the next deadline sweep (once a second), not by
# reading the clock for every chunk: a replica that stops sending is caught within
# idle_timeout_s plus one sweep.
RENEW_AT_SWEEP = -1.0
TAIL_BYTES = 2048  # of a tenant's answer, kept for the engine's `usage` at its end
# How a request for an adapter was served (router/control/resolvers.py): not yet known (or not an
# adapter), by a holder, by a replica whose engine loaded it on the request, after waiting for
# the control plane to load it.
WAY_UNDECIDED, WAY_HOLDER, WAY_RESOLVER, WAY_WAITED = 0, 1, 2, 3


class LifecycleError(RuntimeError):
    pass


class ClientSide:
    """What an exchange needs of the client connection it answers (`front.ClientConnection`).
    A base class rather than a protocol so that, compiled, these are C calls; attributes in
    exchange.pxd (`out` writes to its transport)."""

    def respond(self, status, body, request_id=b"", extra=b"", content_type=b"") -> None:
        raise NotImplementedError

    def request_done(self, now: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Exchange(ResponseListener):
    """Attributes and the C-level methods are typed in exchange.pxd."""

    def __init__(self, client, target, request, request_id, key=0, tenant=None, reserved=0.0):
        self.begin(client, target, request, request_id, key, tenant, reserved)

    def begin(self, client, target, request, request_id, key, tenant=None, reserved=0.0) -> None:
        """What __init__ does, as a C call: the front makes its exchanges with
        `Exchange.__new__` and this, without Python's call protocol."""
        # Read through the typed attributes, not locals: compiled, these are C accesses.
        self.client = client
        self.ctx = self.client.ctx
        self.model = self.routed_model = model = target[0]
        # Metric labels only for names the router routes: a client cannot add series.
        self.label = label = model if model in self.ctx.routed_models else OTHER_MODEL
        self.stats = self.ctx.metrics.models.get(label) or self.ctx.metrics.model(label)
        self.ask_each_replica = target[1]
        self.request = request  # as the client sent it (router.protocol.wire.Request)
        self.request_id = request_id
        self.started = monotonic()  # ctx.clock, as a C call when compiled
        self.key = key  # affinity: which replica's prefix cache likely holds the prompt
        self.stage = PICK
        self.slot = -1
        self.tried: tuple[int, ...] = ()
        self.upstream: UpstreamConnection | None = None
        self.pool: UpstreamPool | None = None
        self.connecting: asyncio.Task | None = None
        self.stale_retried = self.chunked = self.sse = self.first_chunk_seen = False
        self.status = 0
        self.way = WAY_UNDECIDED
        self.deadline = 0.0
        self.last_failure = ""
        # Its tenant (router/tenancy/tenants.py; None without keys): admitted against `reserved`
        # tokens, settled from the answer's end (`tail`) or its count of stream events.
        self.tenant = tenant
        self.reserved = reserved
        self.tail = b""
        self.events = 0
        self.queued_at = 0.0  # when it began to wait for a slot of a saturated model
        # Waiting for its tenant's share here (not yet admitted): the limit that refuses it.
        self.over_share = 0
        self.cut = False  # its answer broke off after it began
        # Its span (router/telemetry/tracing.py) when traces are on and it was sampled; else None.
        self.trace = None if self.ctx.tracing is None else self._sampled(request, request_id)

    def _sampled(self, request, request_id: bytes):
        """Its span if it is traced: it brings a traceparent (whose flag decides), or it is
        the next of the sampled share. Decided here, compiled, so that the requests not traced
        cost a countdown and a field's test, not a call."""
        ctx = self.ctx
        ctx.trace_countdown -= 1
        due = ctx.trace_countdown <= 0
        if due:
            ctx.trace_countdown = ctx.tracing.next_countdown()
        elif request.traceparent is None:
            return None
        return ctx.tracing.begin(request, self.model, request_id, due)

    def _move(self, stage: Stage) -> None:
        allowed, to = _ALLOWED[self.stage], stage  # compiled: C integers
        if not allowed >> to & 1:
            raise LifecycleError(f"exchange cannot go from {self.stage.name} to {stage.name}")
        self.stage = stage

    # Transitions started from inside.

    def start(self) -> None:
        try:
            self._pick()
        except Exception as exc:
            self._broke(exc)

    def _pick(self) -> None:
        if self.stage is not PICK:  # a retry, or released from waiting
            self._move(PICK)
        elif self.ctx.slot_waiters and not self.tried and self.ctx.has_slot_waiters(self.model):
            # Others wait for this model's slots: a newcomer takes its turn behind them.
            self._no_replica(SATURATED)
            return
        table = self.ctx.table
        slot = table.acquire(self.routed_model, self.key, self.tried)
        if slot == NO_MODEL:
            alias = self.ctx.catalog.alias_of(self.model)
            if alias is not None:
                self.routed_model = alias
                slot = table.acquire(alias, self.key, self.tried)
        if slot < 0:
            self._no_replica(slot)
            return
        # 0: WAY_UNDECIDED, as a C constant on every pick; the set is empty without adapters.
        if self.way == 0 and self.routed_model in self.ctx.adapter_models:
            self.way = WAY_HOLDER
            self.ctx.resolvers.ways["holder"] += 1
        self._take(table, slot)

    def _take(self, table, slot: int) -> None:
        if self.tried:
            self.ctx.metrics.retries += 1
        self.slot = slot
        if self.trace is not None:
            self._trace_picked(table, slot)
        # The first pick is microseconds after the start: its time will do.
        now = monotonic() if self.tried else self.started
        self.tried = self.tried + (slot,) if self.tried else (slot,)
        self.pool = pool = self.ctx.pool_for(table.endpoint_url(slot))
        conn = pool.take_idle(now)
        if conn is not None:
            self._send(conn, True, now)
        else:
            self._connect()

    def _resolve(self) -> bool:
        """No holder of the adapter can take it at once: a replica whose engine loads it on
        this request, if the control plane named any (router/control/resolvers.py)."""
        resolvers = self.ctx.resolvers
        route = resolvers.route_of(self.routed_model) if resolvers.routes else None
        if route is None:
            return False
        table = self.ctx.table
        not_there = resolvers.taken.get(self.routed_model, ())  # holds it, loads or unloads it
        slot = table.acquire(route, self.key, self.tried + not_there)
        if slot < 0:
            return False
        if self.way != WAY_WAITED:
            resolvers.ways["resolver"] += 1
        self.way = WAY_RESOLVER
        if self.stage is not PICK:
            self._move(PICK)
        self._take(table, slot)
        return True

    def _no_replica(self, result: int) -> None:
        if result != NO_MODEL and self._resolve():
            return
        if result == NO_MODEL:
            self._finish(
                404, error=(f"The model `{self.model}` does not exist.", "model_not_found")
            )
            return
        if self.tried and result == NO_ENDPOINT:
            if self.ask_each_replica:
                self._finish(404, error=(f"no replica of `{self.model}` knows {self.path}",))
                return
            why = f"no replica of `{self.model}` answered ({self.last_failure})"
            self._finish(502, error=(why,))
            return
        self._move(WAITING)
        if self.trace is not None:
            self.trace.parked("saturated" if result == SATURATED else "no ready replica")
        if result == SATURATED and self.ctx.wait_for_slot(self):
            # Released by priority and weight as slots free (router/path/fairqueue.py).
            if not self.queued_at:
                self.queued_at = monotonic()
                self.deadline = self.queued_at + self.ctx.config.park_timeout_s
            return
        if result == NO_ENDPOINT and self.ctx.park(self):
            # Held until a replica's route arrives (the control plane was told at once).
            self.deadline = self.ctx.clock() + self.ctx.config.park_timeout_s
            if self.way == WAY_UNDECIDED and self.routed_model in self.ctx.adapter_models:
                self.way = WAY_WAITED
                self.ctx.resolvers.ways["waited"] += 1
            return
        why = (
            "is saturated and too many requests wait"
            if result == SATURATED
            else "has no ready replica"
        )
        if result == NO_ENDPOINT and self.ctx.on_demand is not None:
            why = f"has no ready replica and {self.ctx.config.park_max} requests already wait"
        self._finish(
            503,
            error=(f"model `{self.model}` {why}; retry later",),
            extra=b"retry-after: 1\r\n",
        )

    def _trace_picked(self, table, slot: int) -> None:
        load, reported, _ = table.load_of(slot)
        self.trace.picked(table.endpoint_id(slot) or "?", load, reported, len(self.tried) + 1)

    def wait_for_share(self, refused: int) -> None:
        """Over this router's share of one of its tenant's limits (`refused`) while the
        control plane may grow it: it waits (SHARE_WAIT_S at most, or the park timeout)
        rather than being refused; only a share that did not grow in that time answers 429."""
        self.over_share = refused
        self._move(WAITING)
        self.deadline = self.started + min(SHARE_WAIT_S, self.ctx.config.park_timeout_s)
        self.ctx.wait_for_share(self)

    def share_granted(self) -> None:
        """Admitted by its tenant's share (counted in flight): on to a replica."""
        self.over_share = 0
        self.resume()

    def _refuse_over_share(self) -> None:
        refused = self.over_share
        retry = max(1, math.ceil(self.tenant.retry_after(refused)))
        what = LIMIT_NAMES[refused]
        message = f"Rate limit reached for tenant {self.tenant.name} on {what}; retry in {retry}s."
        extra = b"retry-after: %d\r\n" % retry
        self._finish(429, error=(message, "rate_limit_exceeded"), extra=extra)

    def resume(self) -> None:
        """A replica of its model has arrived: pick again."""
        try:
            self._pick()
        except Exception as exc:
            self._broke(exc)

    def refuse_waiting(self, reason: str) -> None:
        try:
            self._finish(
                503,
                error=(f"model `{self.model}` cannot be started: {reason}",),
                extra=b"retry-after: 30\r\n",
            )
        except Exception as exc:
            self._broke(exc)

    @property
    def path(self) -> str:
        return self.request.path.decode(errors="replace")

    def _connect(self) -> None:
        self._move(CONNECT)
        # The task is kept: the loop holds tasks weakly, and client_gone cancels it.
        self.connecting = self.ctx.loop.create_task(self._connecting(self.pool))

    async def _connecting(self, pool: UpstreamPool) -> None:
        try:
            try:
                conn = await pool.connect()
            except (TimeoutError, OSError) as exc:
                kind = "connect_timeout" if isinstance(exc, TimeoutError) else "connect_error"
                self._replica_failed(kind)
                return
            self.connecting = None
            if self.stage is not CONNECT:
                pool.put_back(conn)
                return
            self._send(conn, False, self.ctx.clock())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._broke(exc)

    def _send(self, conn: UpstreamConnection, reused: bool, now: float) -> None:
        self._move(SEND)
        self.upstream = conn
        if self.client.writing_paused:
            conn.pause_reading()  # the client has not drained the last answer yet
        self.deadline = now + self.ctx.first_byte_timeout_s
        if not conn.send(self, self.request_bytes(self.pool)):
            # The replica closed the connection before the request could go.
            self.upstream = None
            self._lost_before_answer(reused)

    def request_bytes(self, pool: UpstreamPool) -> bytes:
        """The request as it goes to the replica: hop-by-hop headers dropped, proxy ones added."""
        request = self.request
        forward = request.forward
        connection = request.connection
        if connection and connection.lower() not in CONNECTION_WITHOUT_NAMES:
            # Headers the client's Connection header names are hop-by-hop too.
            named = {t.strip().lower() for t in connection.split(b",")}
            forward = b"".join(
                [
                    line + b"\r\n"
                    for line in forward.split(b"\r\n")[:-1]
                    if line.partition(b":")[0] not in named
                ]
            )
        if self.trace is not None:
            forward = self.trace.forward(forward)
        return request.upstream(
            pool.path_prefix, pool.host_header, forward, self.client.peer, self.request_id
        )

    def _lost_before_answer(self, reused: bool) -> None:
        if reused and not self.stale_retried:
            # A pooled connection the replica had just closed (engines close idle keep-alive
            # connections): not the replica's fault. Once, the same replica on a new one.
            self.stale_retried = True
            self.ctx.metrics.upstream_error(self.label, "stale_connection")
            self._connect()
            return
        self._replica_failed("reset")

    def _replica_failed(self, kind: str) -> None:
        """Nothing reached the client yet: count the failure and try another replica."""
        self.connecting = None
        self.last_failure = kind
        self.ctx.metrics.upstream_error(self.label, kind)
        self._release(failed=True)
        if len(self.tried) < self.ctx.max_tries:
            if self.trace is not None:
                self.trace.retried(kind)
            self._pick()
            return
        self._finish(502, error=(f"no replica of `{self.model}` answered ({kind})",))

    def _release(self, failed: bool) -> None:
        slot, self.slot = self.slot, -1
        if slot >= 0 and self.ctx.table.release(slot, failed):
            self._ejected(slot)

    def _ejected(self, slot: int) -> None:
        replica = self.ctx.table.endpoint_id(slot) or "?"
        self.ctx.metrics.ejected(self.label, replica)
        log.warning(
            "replica %s of model %s ejected after consecutive failures (last: %s)",
            replica,
            self.label,
            self.last_failure or f"HTTP {self.status}",
        )

    def _end_broken_answer(self, message: str) -> None:
        if self.sse and self.chunked:
            event = sse_error_event(message)
            self._write(b"%x\r\n%s\r\n%s" % (len(event), event, CHUNK_END))
        else:
            # A body cannot carry an error now: the client learns from the cut connection.
            self.client.keep_alive = False
        self.cut = True
        self._finish(self.status, failed=True)

    def _finish(self, status: int, failed: bool = False, error: tuple = (), extra=b"") -> None:
        """The end of every path: release, count, answer the client. Runs once."""
        if self.stage is DONE:
            return
        if self.stage is WAITING:
            self.ctx.unpark(self)
        self.stage = DONE  # every other state may end: no need to consult the table
        self.status = status
        if self.connecting is not None:
            self.connecting.cancel()
            self.connecting = None
        if self.upstream is not None:
            upstream, self.upstream = self.upstream, None
            upstream.detach()
        slot = self.slot
        if slot >= 0:
            self.slot = -1
            if self.ctx.table.release(slot, failed):
                self._ejected(slot)
        self.ctx.metrics.in_flight -= 1
        now = monotonic()
        self.stats.finished(status, now - self.started if self.tried else None)
        tenant = self.tenant
        if tenant is not None:
            if self.over_share:  # never admitted: refused, or its client left while it waited
                if status == 429:
                    tenant.count(self.label, status, 0, 0, True, 0.0)
            else:
                self._settle(status)
                if self.ctx.share_waiting:
                    self.ctx.admit_share_waiters(tenant.name)  # its slot is free here
            if error and tenant.limited:
                extra += tenant.limit_headers()
        if self.trace is not None:
            self._trace_end(status)
        if slot >= 0 and self.ctx.slot_waiters:
            self.ctx.slot_freed(self.routed_model)
        client = self.client
        if client.closed:
            client.exchange = None
            return
        if error:
            message, code = error if len(error) == 2 else (error[0], None)
            client.respond(status, error_body(status, message, code), self.request_id, extra)
        else:
            client.request_done(now)

    def _trace_end(self, status: int) -> None:
        trace, self.trace = self.trace, None
        prompt = completion = -1
        if self.tail:
            used = usage_tokens(self.tail)
            if used >= 0:
                prompt = used >> 32
                completion = used - (prompt << 32)
        tenant = self.tenant.name if self.tenant is not None else None
        trace.end(status, tenant, prompt, completion, self.cut)

    def _settle(self, status: int) -> None:
        """Count the answer for its tenant, and give its token bucket back the estimate less
        what the engine used: its `usage` at the answer's end, else, for a stream, one token
        per content event sent (a cut stream: those sent), else the estimate."""
        tenant = self.tenant
        prompt = completion = -1
        if self.tail:
            used = usage_tokens(self.tail)  # both, or -1
            if used >= 0:
                prompt = used >> 32
                completion = used - (prompt << 32)
        if prompt < 0 or completion < 0:
            if not self.tail:  # nothing came from an engine
                prompt = completion = 0
            else:
                prompt = len(self.request.body) // BYTES_PER_TOKEN
                if self.sse:
                    # Its events less the closing pair: the one with the finish reason, and
                    # [DONE]; a stream cut short has neither.
                    completion = self.events - (2 if b"data: [DONE]" in self.tail else 0)
                else:
                    completion = max(0, int(self.reserved) - prompt)  # what it was admitted for
        waited = monotonic() - self.queued_at if self.queued_at else 0.0
        tenant.count(self.label, status, prompt, completion, False, waited)
        tenant.settle(self.reserved, prompt + completion)

    def _keep_tail(self, data: bytes) -> None:
        """The answer's last bytes, where `usage` is, and its count of stream events."""
        if self.sse:
            self.events += data.count(b"data: ")
        most = TAIL_BYTES  # compiled, a C integer: no Python comparison a chunk
        tail = self.tail + data if self.tail and len(data) < most else data
        self.tail = tail[len(tail) - most :] if len(tail) > most else tail

    def _broke(self, exc: BaseException) -> None:
        """A bug on some path: log it, and still end the exchange properly."""
        log.error(
            "exchange %s failed in %s", self.request_id.decode(), self.stage.name, exc_info=exc
        )
        try:
            if self.stage is RELAY:
                self._end_broken_answer("the router failed while relaying the answer")
            elif self.stage is not DONE:
                self._finish(502, error=("the router failed to relay this request",))
            else:
                self.client.close()
        except Exception:
            log.exception("exchange %s could not be finished", self.request_id.decode())
            self.client.close()

    # Events from outside: each catches what it raises.

    def _write(self, data: bytes) -> None:
        if not self.client.closed:
            self.client.out.write(data)

    def upstream_headers(self, status: int, head) -> None:
        try:
            if self.stage is not SEND:
                return
            if status == 404 and self.ask_each_replica and self._untried_replicas():
                # State kept on one replica (a stored response): ask the next one.
                upstream, self.upstream = self.upstream, None
                upstream.detach()
                self._release(failed=False)
                self._pick()
                return
            self.stage = RELAY  # from SEND, checked above: always a legal move
            self.status = status
            if status == 404 and self.way == WAY_RESOLVER:
                # Its engine could not load the adapter: relayed as the engine said it.
                endpoint = self.ctx.table.endpoint_id(self.slot) or "?"
                self.ctx.resolvers.failed(self.routed_model, endpoint, status)
            self.deadline = RENEW_AT_SWEEP
            self.sse = head.sse
            self.chunked = not head.length_given
            # Written with the body this read brings: one write for the whole read.
            tenant = self.tenant
            if tenant is not None and tenant.limited:
                head.relay_head(self.request_id, not self.client.keep_alive, tenant.limit_headers())
            else:
                head.relay_head(self.request_id, not self.client.keep_alive)
        except Exception as exc:
            self._broke(exc)

    def _untried_replicas(self) -> bool:
        return len(self.ctx.table.endpoints(self.routed_model)) > len(self.tried)

    def upstream_body(self, data: bytes) -> None:
        try:
            if self.stage is not RELAY:
                return
            upstream = self.upstream
            if not self.first_chunk_seen and upstream is not None and upstream.reader.body_begun:
                # The first of the body, not the head: engines send the head before generating.
                self.first_chunk_seen = True
                self.stats.first_token.observe(monotonic() - self.started)
                if self.trace is not None:
                    self.trace.first_byte()
            self.deadline = RENEW_AT_SWEEP  # no clock read per chunk
            if self.tenant is not None or self.trace is not None:
                self._keep_tail(data)
            self._write(data)
        except Exception as exc:
            self._broke(exc)

    def upstream_complete(self, reusable: bool) -> None:
        try:
            self.upstream = None
            if self.stage is not RELAY:
                return
            status = self.status
            # 5xx is the replica's failure, except 501: the client asked for what it does not
            # serve (an endpoint the engine was not started with).
            self._finish(status, failed=status >= 500 and status != 501)
        except Exception as exc:
            self._broke(exc)

    def upstream_lost(self, reason: str, reused: bool) -> None:
        try:
            self.upstream = None
            if self.stage is SEND:
                self._lost_before_answer(reused)
            elif self.stage is RELAY:
                self.ctx.metrics.upstream_error(self.label, "lost_mid_answer")
                self._end_broken_answer(f"the replica closed the connection mid-answer ({reason})")
        except Exception as exc:
            self._broke(exc)

    def check_deadline(self, now: float) -> None:
        try:
            if self.over_share:
                if now >= self.deadline:
                    self._refuse_over_share()
                return
            if self.stage is WAITING and now >= self.deadline and self.queued_at:
                waited = round(self.ctx.config.park_timeout_s)
                self._finish(
                    503,
                    error=(f"model `{self.model}` stayed saturated for {waited}s; retry later",),
                    extra=b"retry-after: 5\r\n",
                )
                return
            if self.stage is WAITING and now >= self.deadline:
                waited = round(self.ctx.config.park_timeout_s)
                why = self.ctx.waiting_reason.get(self.routed_model)
                self._finish(
                    503,
                    error=(
                        f"no replica of `{self.model}` came within {waited}s"
                        + (f" ({why})" if why else "")
                        + "; retry later",
                    ),
                    extra=b"retry-after: 5\r\n",
                )
                return
            if self.stage not in (SEND, RELAY):
                return
            if self.deadline == RENEW_AT_SWEEP:
                self.deadline = now + self.ctx.idle_timeout_s
                return
            if now < self.deadline:
                return
            upstream, self.upstream = self.upstream, None
            if upstream is not None:
                upstream.detach()
            self.last_failure = "timeout"
            self.ctx.metrics.upstream_error(self.label, "timeout")
            if self.stage is RELAY:
                self._end_broken_answer("the replica stopped sending")
            else:
                self._finish(
                    504,
                    failed=True,
                    error=(f"the replica of `{self.model}` did not answer in time",),
                )
        except Exception as exc:
            self._broke(exc)

    def client_gone(self) -> None:
        try:
            self._finish(499)
        except Exception as exc:
            self._broke(exc)

    def pause_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

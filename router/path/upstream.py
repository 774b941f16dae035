"""Pooled keep-alive HTTP/1.1 connections to replicas, their answers read by `router.protocol.wire`.

An `UpstreamConnection` carries one exchange at a time and reports what it parses to a
listener (the client connection that sent the request); when the answer is complete and the
replica allows keep-alive, the connection goes back to its pool.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

from router.path.sender import Sender
from router.protocol.errors import InvalidResponse
from router.protocol.sink import AnswerSink
from router.protocol.wire import ResponseReader, monotonic


class ResponseListener:
    """What an upstream connection reports to (an `Exchange`). A base class rather than a
    protocol so that, compiled, these calls are C calls."""

    def upstream_headers(self, status: int, head: ResponseReader) -> None:
        """`head.relay_head(...)` passes the head on; `head.length_given`, `head.sse`."""
        raise NotImplementedError

    def upstream_body(self, data: bytes) -> None:
        """What one read brought for the client, framed: one write."""
        raise NotImplementedError

    def upstream_complete(self, reusable: bool) -> None:
        raise NotImplementedError

    def upstream_lost(self, reason: str, reused: bool) -> None:
        raise NotImplementedError


class UpstreamConnection(AnswerSink):
    """An asyncio protocol (by its methods: a compiled class cannot derive from
    asyncio.Protocol) and its ResponseReader's sink; attributes are typed in upstream.pxd."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.out: Sender | None = None
        self.reader = ResponseReader(self)
        self.listener: ResponseListener | None = None
        self.closed = False
        self.served = 0  # answers completed on this connection
        self.idle_since = 0.0
        self.paused = False  # reading paused: the client is slower than the replica

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.out = Sender(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, listener: ResponseListener, request: bytes) -> bool:
        """Write the request; False when the replica has already closed the connection (it
        can between connect and send, or while the connection sat in the pool). A close
        still on its way arrives as connection_lost, which the listener hears."""
        if self.closed:
            return False
        try:
            self.out.write(request)
        except RuntimeError:  # uvloop: the handle closed under us
            return False
        self.listener = listener
        return True

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
        except InvalidResponse:
            self.abort("invalid HTTP from upstream")

    # what the reader tells

    def answer_head(self, status: int) -> None:
        if self.listener is not None:
            self.listener.upstream_headers(status, self.reader)

    def answer_body(self, data: bytes) -> None:
        if self.listener is not None:
            self.listener.upstream_body(data)

    def answer_complete(self, keep_alive: bool) -> None:
        self.served += 1
        listener, self.listener = self.listener, None
        reusable = keep_alive and not self.closed
        # Back in the pool before the listener hears of it: the client's next (pipelined)
        # request, started from there, can take this very connection.
        if reusable:
            if self.paused:
                # The answer ended in the read that filled the client's buffer: the client's
                # resume goes to its exchange, which is over, so the pool resumes it.
                self.resume_reading()
            self.pool.put_back(self)
        else:
            self.close()
        if listener is not None:
            listener.upstream_complete(reusable)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.listener is None:
            return
        if self.reader.feed_eof():
            return  # a body with neither length nor chunks ends with the connection
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.upstream_lost(
                "connection reset" if exc else "connection closed", self.served > 0
            )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def abort(self, reason: str) -> None:
        """Drop the connection now; the listener hears `reason`."""
        listener, self.listener = self.listener, None
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.abort()
        if listener is not None:
            listener.upstream_lost(reason, False)

    def detach(self) -> None:
        """The client went away: drop the connection so the engine stops generating."""
        self.listener = None
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if not self.closed and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.closed and self.paused:
            self.paused = False
            self.transport.resume_reading()


class UpstreamPool:
    """Idle keep-alive connections to one replica."""

    def __init__(
        self,
        url: str,
        connect_timeout: float,
        max_idle: int = 256,
        max_idle_s: float = 4.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http:// upstreams are supported, got {url!r}")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = f"{self.host}:{self.port}".encode()
        self.path_prefix = parts.path.rstrip("/").encode()
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        # Engines served by uvicorn (vLLM, SGLang) close idle keep-alive connections after 5 s;
        # reusing one just as it closes would fail the request, so ours retire sooner.
        self.max_idle_s = max_idle_s
        self.idle: list[UpstreamConnection] = []
        self.open: set[UpstreamConnection] = set()
        # The router's loop, given rather than asked for per request:
        # asyncio.get_running_loop() makes a getpid() system call each time.
        self.loop = loop

    def take_idle(self, now: float) -> UpstreamConnection | None:
        """The most recently used idle connection that is still fresh."""
        while self.idle:
            conn = self.idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > self.max_idle_s:
                conn.close()
                self.open.discard(conn)
                continue
            return conn
        return None

    async def connect(self) -> UpstreamConnection:
        loop = self.loop or asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(
                lambda: UpstreamConnection(self), self.host, self.port
            )
        self.open.add(conn)
        return conn

    def busy(self) -> bool:
        """Whether some connection is carrying an exchange now."""
        return len(self.open) > len(self.idle)

    def put_back(self, conn: UpstreamConnection) -> None:
        if len(self.idle) < self.max_idle:
            conn.idle_since = monotonic()  # the router's clock (ProxyContext.clock)
            self.idle.append(conn)
        else:
            conn.close()

    def forget(self, conn: UpstreamConnection) -> None:
        self.open.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        for conn in list(self.open):
            conn.close()
        self.idle.clear()

"""The exchange's state machine in process: real ClientConnection, Exchange and
UpstreamConnection objects, transports that record, replicas that fail at each state.

Every test ends by checking what no path may break: the client got exactly one answer (or
its connection was closed), and no slot is left counted in flight.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from router.path.context import ProxyConfig, ProxyContext
from router.path.exchange import CONNECT, DONE, PICK, RELAY, SEND, Exchange, LifecycleError
from router.path.fastpath import EndpointTable
from router.path.front import ClientConnection
from router.path.upstream import UpstreamConnection, UpstreamPool
from router.protocol.forwarding import MAX_ANSWER_HEAD_BYTES

URLS = {f"r{i}": f"http://127.0.0.1:{9100 + i}" for i in range(3)}
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def request(body: bytes = b'{"model": "m"}', path: bytes = b"/v1/chat/completions") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: r\r\ncontent-length: %d\r\n\r\n%s" % (path, len(body), body)


class Recording:
    def __init__(self) -> None:
        self.data = b""
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.data += data

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 50000) if name == "peername" else default

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    resume_reading = pause_reading


class FakePool(UpstreamPool):
    """A pool whose connections are recorded objects; `plan` says what each connect does:
    "ok", "refuse" (connection refused), "closed" (connects, then the replica closes it
    before the request goes), "hang" (never connects)."""

    def __init__(self, url: str, plan: list[str]) -> None:
        super().__init__(url, connect_timeout=1)
        self.plan = plan
        self.made: list[UpstreamConnection] = []

    async def connect(self) -> UpstreamConnection:
        step = self.plan.pop(0) if self.plan else "ok"
        if step == "refuse":
            raise ConnectionRefusedError("refused")
        if step == "hang":
            await asyncio.Event().wait()
        conn = UpstreamConnection(self)
        conn.connection_made(Recording())
        self.open.add(conn)
        self.made.append(conn)
        if step == "closed":
            conn.connection_lost(None)
        return conn


class Rig:
    def __init__(self, plans: dict[str, list[str]] | None = None, **config) -> None:
        self.table = EndpointTable(failures_to_eject=config.pop("failures_to_eject", 5))
        self.table.update({"m": list(URLS.items()), "empty": []})
        self.ctx = ProxyContext(self.table, ProxyConfig(**config))
        self.pools = {
            rid: FakePool(url, list((plans or {}).get(rid, []))) for rid, url in URLS.items()
        }
        for rid, pool in self.pools.items():
            self.ctx.pools[URLS[rid]] = pool
        self.client = ClientConnection(self.ctx)
        self.transport = Recording()
        self.client.connection_made(self.transport)

    def send(self, raw: bytes = b"") -> Exchange | None:
        self.client.data_received(raw or request())
        return self.client.exchange

    def answer(self, exchange: Exchange, raw: bytes = OK) -> None:
        exchange.upstream.data_received(raw)

    def status(self) -> int:
        return int(self.transport.data.split(b" ", 2)[1]) if self.transport.data else 0

    def error(self) -> dict:
        return json.loads(self.transport.data.partition(b"\r\n\r\n")[2])["error"]

    def replica_of(self, exchange: Exchange) -> str:
        return self.table.endpoint_id(exchange.slot)

    def nothing_in_flight(self) -> bool:
        return all(self.table.in_flight(slot) == 0 for slot, _, _ in self.table.endpoints("m"))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(test):
    """Run an async test body on a fresh loop."""
    return asyncio.run(test())


def test_a_pooled_connection_answers_and_goes_back():
    async def body():
        rig = Rig()
        exchange = rig.send()
        assert exchange.stage is CONNECT
        await settle()
        assert exchange.stage is SEND
        rig.answer(exchange)
        assert exchange.stage is DONE and rig.status() == 200
        assert rig.nothing_in_flight()
        assert sum(len(p.idle) for p in rig.pools.values()) == 1

    run(body)


def test_a_replica_that_closes_between_connect_and_send_is_retried_elsewhere():
    # The lost-request defect: the connection was closed when the request was to be written.
    async def body():
        rig = Rig({rid: ["closed"] for rid in URLS if rid != "r2"})
        exchange = rig.send()
        await settle()
        assert exchange.stage is SEND and rig.replica_of(exchange) == "r2"
        rig.answer(exchange)
        assert rig.status() == 200 and rig.nothing_in_flight()

    run(body)


def test_when_every_replica_fails_the_client_gets_502_and_no_replica_twice():
    async def body():
        rig = Rig({rid: ["refuse"] * 5 for rid in URLS}, max_tries=5)
        exchange = rig.send()
        await settle()
        assert exchange.stage is DONE and rig.status() == 502
        assert len(exchange.tried) == len(set(exchange.tried)) == 3
        assert "connect_error" in rig.error()["message"]
        assert rig.nothing_in_flight() and rig.ctx.metrics.retries == 2

    run(body)


def test_a_stale_pooled_connection_goes_again_to_the_same_replica_unblamed():
    async def body():
        rig = Rig()
        rig.table.update({"m": [("r0", URLS["r0"])]})
        first = rig.send()
        await settle()
        rig.answer(first)
        second = rig.send()
        assert second.stage is SEND  # on the pooled connection
        pooled = second.upstream
        pooled.connection_lost(None)  # the replica had closed it as the request went
        assert second.stage is CONNECT and rig.replica_of(second) == "r0"
        await settle()
        rig.answer(second)
        assert rig.status() == 200 and rig.nothing_in_flight()
        assert rig.ctx.metrics.upstream_errors == {("m", "stale_connection"): 1}
        assert not rig.table.is_ejected(0)

    run(body)


def test_a_replica_lost_before_the_answer_head_is_retried_on_another():
    async def body():
        rig = Rig()
        exchange = rig.send()
        await settle()
        first = rig.replica_of(exchange)
        exchange.upstream.connection_lost(ConnectionResetError())
        assert exchange.stage is CONNECT
        await settle()
        assert rig.replica_of(exchange) != first
        rig.answer(exchange)
        assert rig.status() == 200 and rig.nothing_in_flight()

    run(body)


def test_a_replica_lost_mid_stream_ends_the_stream_with_an_error_event():
    async def body():
        rig = Rig()
        exchange = rig.send()
        await settle()
        rig.answer(exchange, SSE_HEAD + b'10\r\ndata: {"a": 1}\n\n\r\n')
        assert exchange.stage is RELAY
        exchange.upstream.connection_lost(ConnectionResetError())
        assert exchange.stage is DONE
        assert b'"code":"upstream_disconnected"' in rig.transport.data
        assert rig.transport.data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        assert rig.nothing_in_flight()

    run(body)


@pytest.mark.parametrize("stage", ["connect", "send", "relay"])
def test_a_client_that_goes_away_frees_everything_at_each_state(stage):
    async def body():
        rig = Rig({rid: ["hang"] for rid in URLS} if stage == "connect" else None)
        exchange = rig.send()
        await settle()
        upstream = exchange.upstream
        if stage == "relay":
            rig.answer(exchange, SSE_HEAD)
        task = exchange.connecting
        rig.client.connection_lost(None)
        await settle()
        assert exchange.stage is DONE and rig.nothing_in_flight()
        assert rig.ctx.metrics.in_flight == 0
        if stage == "connect":
            assert task.cancelled()
        else:
            assert upstream.transport.aborted  # the engine stops generating

    run(body)


@pytest.mark.parametrize("stage", ["send", "relay"])
def test_deadlines_end_the_exchange_at_each_state(stage):
    async def body():
        rig = Rig(first_byte_timeout_s=10, idle_timeout_s=5)
        exchange = rig.send()
        await settle()
        if stage == "relay":
            rig.answer(exchange, SSE_HEAD)
        rig.ctx.sweep()
        assert exchange.stage is not DONE
        rig.client.check_deadlines(rig.ctx.loop.time() + 11)
        assert exchange.stage is DONE and rig.nothing_in_flight()
        if stage == "send":
            assert rig.status() == 504
        else:
            assert b"the replica stopped sending" in rig.transport.data

    run(body)


def test_no_ready_replica_waits_then_answers_503_with_retry_after():
    async def body():
        rig = Rig()
        exchange = rig.send(request(b'{"model": "empty"}'))
        assert exchange is None and rig.status() == 503
        assert b"retry-after: 1" in rig.transport.data
        assert rig.ctx.metrics.in_flight == 0

    run(body)


def test_a_bug_on_the_way_still_answers_the_client_and_frees_the_slot():
    async def body():
        rig = Rig()
        exchange = rig.send()
        await settle()
        # No peer address: building the request for the retry raises, as a bug would.
        exchange.client.peer = None
        exchange.upstream.connection_lost(None)  # the retry path now hits the bug
        await settle()
        assert exchange.stage is DONE and rig.status() == 502
        assert "router failed" in rig.error()["message"]
        assert rig.nothing_in_flight()

    run(body)


def test_a_move_outside_the_table_is_refused():
    async def body():
        rig = Rig()
        exchange = rig.send()
        with pytest.raises(LifecycleError):
            exchange._move(RELAY)  # CONNECT cannot relay before it has sent
        assert exchange.stage is CONNECT
        exchange._move(PICK)  # a legal move: a failed connect picks again

    run(body)


def test_a_501_is_the_clients_mistake_and_ejects_nothing():
    async def body():
        rig = Rig(failures_to_eject=2)
        unsupported = b"HTTP/1.1 501 Not Implemented\r\ncontent-length: 2\r\n\r\n{}"
        for _ in range(12):
            exchange = rig.send()
            await settle()
            rig.answer(exchange, unsupported)
            assert rig.status() == 501
            rig.transport.data = b""
        assert not any(rig.table.is_ejected(slot) for slot, _, _ in rig.table.endpoints("m"))
        broken = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 2\r\n\r\n{}"
        for _ in range(6):
            exchange = rig.send()
            await settle()
            rig.answer(exchange, broken)
        assert any(rig.table.is_ejected(slot) for slot, _, _ in rig.table.endpoints("m"))
        assert sum(rig.ctx.metrics.ejections.values()) >= 1

    run(body)


def test_the_first_token_is_timed_at_the_first_body_not_at_the_head():
    """Engines send a stream's head before they generate: its arrival is not a token."""

    async def body():
        rig = Rig()
        exchange = rig.send()
        await settle()
        first_token = rig.ctx.metrics.models["m"].first_token
        rig.answer(exchange, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        assert exchange.stage is RELAY and first_token.count == 0
        assert rig.transport.data.endswith(b"\r\n\r\n")  # the head went out at once
        rig.answer(exchange, b"data: 1\n\n")
        assert first_token.count == 1
        exchange.upstream.connection_lost(None)
        assert exchange.stage is DONE and rig.transport.data.endswith(b"0\r\n\r\n")

    run(body)


def test_a_replica_whose_answer_head_is_too_large_is_dropped_for_another():
    async def body():
        rig = Rig()
        exchange = rig.send()
        await settle()
        first = rig.replica_of(exchange)
        connection = exchange.upstream
        too_large = b"x-big: %s\r\n" % (b"v" * MAX_ANSWER_HEAD_BYTES)
        rig.answer(exchange, b"HTTP/1.1 200 OK\r\n" + too_large + b"content-length: 0\r\n\r\n")
        assert connection.closed and rig.transport.data == b""  # nothing relayed
        await settle()
        assert exchange.stage is SEND and rig.replica_of(exchange) != first
        assert rig.ctx.metrics.upstream_errors == {("m", "reset"): 1}
        rig.answer(exchange)
        assert rig.status() == 200 and rig.nothing_in_flight()

    run(body)


def test_an_exchange_that_starts_while_the_client_is_still_slow_pauses_its_replica():
    """asyncio says pause_writing once, while the last answer drains: the next exchange must
    not read its replica's answer at full speed into the client's buffer meanwhile."""

    async def main():
        rig = Rig()
        rig.client.pause_writing()  # the previous answer filled the client's buffer
        exchange = rig.send()
        await settle()
        assert exchange.upstream is not None and exchange.upstream.paused
        rig.client.resume_writing()
        assert not exchange.upstream.paused
        rig.answer(exchange)
        assert rig.status() == 200

    asyncio.run(main())

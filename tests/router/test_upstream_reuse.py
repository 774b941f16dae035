"""A replica that closes idle keep-alive connections (uvicorn does after 5 s): a request that
lands on such a connection is sent again on a new one, and the replica is not blamed."""

import asyncio
import time

import pytest

from tests.harness import get, post
from tests.router.fake_upstreams import serving

pytestmark = pytest.mark.integration
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class ClosesReusedConnections(asyncio.Protocol):
    """Answers the first request of each connection; drops the connection on the second, as a
    server does whose keep-alive timer fired while the request was on its way."""

    def connection_made(self, transport):
        self.transport = transport
        self.answered = 0
        self.buffer = b""

    def data_received(self, data):
        self.buffer += data
        if b"\r\n\r\n" not in self.buffer:
            return
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        if len(rest) < length:
            return
        self.buffer = rest[length:]
        if self.answered:
            self.transport.abort()
            return
        self.answered += 1
        self.transport.write(ANSWER)


@pytest.fixture
def fake_upstream():
    with serving(ClosesReusedConnections) as url:
        yield url


def metric(router, name):
    text = get(router + "/metrics")[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_a_stale_pooled_connection_is_retried_on_a_new_one(procs, fake_upstream):
    router, _ = procs.router(f"--backend=m={fake_upstream}")
    for _ in range(5):
        status, _, body = post(router + "/v1/completions", b'{"model": "m"}')
        assert (status, body) == (200, b"{}")
    assert metric(router, 'gpurouter_upstream_errors_total{model="m",kind="stale_connection"}') == 4
    assert metric(router, "gpurouter_retries_total") == 0
    assert metric(router, "gpurouter_ejections_total") == 0


class FakeTransport:
    closed = False

    def close(self):
        self.closed = True


def test_idle_connections_retire_before_the_engines_keepalive_ends():
    from router.path.upstream import UpstreamConnection, UpstreamPool

    pool = UpstreamPool("http://127.0.0.1:1", connect_timeout=1, max_idle_s=4.0)
    fresh, stale = UpstreamConnection(pool), UpstreamConnection(pool)
    for conn, idle_since in ((stale, 0.0), (fresh, 8.0)):
        conn.transport = FakeTransport()
        conn.idle_since = idle_since
        pool.open.add(conn)
    pool.idle = [stale, fresh]
    assert pool.take_idle(now=10.0) is fresh
    assert pool.take_idle(now=10.0) is None
    assert stale.transport.closed and stale not in pool.open


def test_a_connection_goes_back_to_its_pool_without_asking_asyncio_for_the_loop(monkeypatch):
    """asyncio.get_running_loop() costs a getpid() system call: not once per request. Its
    idle time starts on the router's clock."""
    from router.path.upstream import UpstreamConnection, UpstreamPool

    pool = UpstreamPool("http://127.0.0.1:9", 1.0)
    asked = []
    monkeypatch.setattr(asyncio, "get_running_loop", lambda: asked.append(1))
    conn = UpstreamConnection(pool)
    before = time.monotonic()
    pool.put_back(conn)
    assert asked == [] and pool.idle == [conn]
    assert before <= conn.idle_since <= time.monotonic()

"""A client that reads slowly pauses the replica's connection (backpressure); an answer that
ends while it is paused must not leave the connection paused in its pool, or the next request
sent on it waits for an answer nobody reads until the idle deadline cuts it."""

from router.path.upstream import ResponseListener, UpstreamConnection, UpstreamPool

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class PausableTransport:
    def __init__(self) -> None:
        self.reading = True
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def get_extra_info(self, name):
        return None

    def close(self) -> None:
        pass


class Listener(ResponseListener):
    def __init__(self) -> None:
        self.completed: list[bool] = []

    def upstream_headers(self, status, head) -> None:
        pass

    def upstream_body(self, data) -> None:
        pass

    def upstream_complete(self, reusable) -> None:
        self.completed.append(reusable)

    def upstream_lost(self, reason, reused) -> None:
        raise AssertionError(reason)


def connection() -> tuple[UpstreamPool, UpstreamConnection, PausableTransport]:
    pool = UpstreamPool("http://127.0.0.1:9", 1.0)
    conn = UpstreamConnection(pool)
    transport = PausableTransport()
    conn.connection_made(transport)
    pool.open.add(conn)
    return pool, conn, transport


def test_an_answer_that_ends_while_paused_goes_back_to_the_pool_reading():
    pool, conn, transport = connection()
    listener = Listener()
    assert conn.send(listener, b"POST / HTTP/1.1\r\n\r\n")
    conn.pause_reading()  # the client's buffer filled as this read was relayed
    conn.data_received(ANSWER)
    assert listener.completed == [True]
    assert pool.idle == [conn]
    assert transport.reading, "a pooled connection was left paused: its next answer is never read"


def test_a_paused_connection_that_is_not_reused_stays_as_it_was():
    """Only a connection that goes back to the pool is resumed; one that closes is not read."""
    pool, conn, transport = connection()
    listener = Listener()
    conn.send(listener, b"POST / HTTP/1.1\r\n\r\n")
    conn.pause_reading()
    conn.data_received(ANSWER.replace(b"200 OK\r\n", b"200 OK\r\nconnection: close\r\n"))
    assert listener.completed == [False] and pool.idle == []

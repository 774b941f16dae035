"""A streamed answer goes on chunk by chunk: the replica writes each event only after the client
has read the one before, so a router that held a chunk back (waiting for more data, filling a
buffer) would stall the stream, and the test fails on its socket's timeout. Nothing is timed."""

import asyncio
import socket
import threading

import pytest

from tests.router.fake_upstreams import serving

pytestmark = pytest.mark.integration
EVENTS = 5


class LockstepStream(asyncio.Protocol):
    """Answers one streaming request; event N+1 waits until the client has seen event N."""

    def __init__(self, seen: list[threading.Event]) -> None:
        self.seen = seen
        self.transport = None
        self.task = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.task is None and b"\r\n\r\n" in data:
            self.task = asyncio.get_running_loop().create_task(self.stream())

    async def stream(self) -> None:
        loop = asyncio.get_running_loop()
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for number, seen in enumerate(self.seen):
            event = b"data: %d\n\n" % number
            self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
            if not await loop.run_in_executor(None, seen.wait, 10):
                self.transport.abort()  # the client never got it: the router held it back
                return
        self.transport.write(b"0\r\n\r\n")


def test_each_event_reaches_the_client_before_the_replica_writes_the_next(procs):
    seen = [threading.Event() for _ in range(EVENTS)]
    with serving(lambda: LockstepStream(seen)) as upstream:
        router, _ = procs.router(f"--backend=m={upstream}")
        host, port = router.removeprefix("http://").split(":")
        body = b'{"model": "m", "stream": true}'
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            received = b""
            for number in range(EVENTS):
                while b"data: %d\n\n" % number not in received:
                    chunk = conn.recv(65536)  # a held-back event ends here, in a timeout
                    assert chunk, f"the router closed the stream before event {number}"
                    received += chunk
                seen[number].set()
            while not received.endswith(b"0\r\n\r\n"):
                chunk = conn.recv(65536)
                assert chunk, "the stream ended without its last chunk"
                received += chunk
    assert received.startswith(b"HTTP/1.1 200 ")
    assert all(b"data: %d\n\n" % n in received for n in range(EVENTS))

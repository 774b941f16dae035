"""router/path/sender.py: bytes written from C while the transport holds none, through the
transport once the socket is full, in order either way; a closing transport gets every write."""

import asyncio
import socket

import pytest
import uvloop

from router.path.sender import Sender

# uvloop, the router's loop, and asyncio's own: the sender takes any transport. Neither loop
# closes the socket within close(), so a write just after it would still reach the socket if
# the sender did not ask whether the transport is closing (both fail without that question).
LOOPS = pytest.mark.parametrize("run", [uvloop.run, asyncio.run], ids=["uvloop", "asyncio"])


class Held(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport = transport


async def pair():
    """A loopback connection: the writing side's transport, and a plain socket that reads
    only when told to (so the writer's socket buffer fills)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    port = listener.getsockname()[1]
    connecting = loop.create_connection(Held, "127.0.0.1", port)
    accepted, (transport, _) = await asyncio.gather(loop.sock_accept(listener), connecting)
    listener.close()
    return transport, accepted[0]


@LOOPS
def test_a_full_socket_spills_into_the_transport_and_the_bytes_keep_their_order(run):
    async def main():
        transport, reader = await pair()
        sender = Sender(transport)
        assert sender.fd == transport.get_extra_info("socket").fileno()
        pieces = [b"%08d" % i * 8192 for i in range(200)]  # 64 KiB each, 12.5 MiB in all
        for piece in pieces:
            sender.write(piece)
        assert sender.spilled and transport.get_write_buffer_size() > 0
        loop = asyncio.get_running_loop()
        wanted = b"".join(pieces)
        got = bytearray(await loop.sock_recv(reader, 1 << 20))
        # The socket has room again, the transport still holds bytes: this goes after them.
        assert transport.get_write_buffer_size() > 0
        sender.write(b"marker")
        wanted += b"marker"
        while len(got) < len(wanted):
            got += await loop.sock_recv(reader, 1 << 20)
        assert bytes(got) == wanted
        while transport.get_write_buffer_size():
            await asyncio.sleep(0.01)
        sender.write(b"tail")  # drained: from C again
        assert not sender.spilled
        assert await loop.sock_recv(reader, 16) == b"tail"
        transport.close()
        reader.close()

    run(main())


@LOOPS
def test_a_closing_transport_gets_the_write_and_nothing_reaches_the_socket(run):
    async def main():
        transport, reader = await pair()
        sender = Sender(transport)
        transport.close()
        sender.write(b"late")  # the transport's to refuse or drop, as without the sender
        await asyncio.sleep(0.05)
        reader.setblocking(False)
        loop = asyncio.get_running_loop()
        assert await loop.sock_recv(reader, 16) == b""  # the close, and no bytes before it
        reader.close()

    run(main())


def test_a_transport_without_a_socket_gets_every_write():
    class Recording:
        def __init__(self) -> None:
            self.written = []

        def get_extra_info(self, name, default=None):
            return default

        def write(self, data):
            self.written.append(data)

        def is_closing(self):
            return False

    recording = Recording()
    sender = Sender(recording)
    sender.write(b"a")
    sender.write(b"b")
    assert sender.fd == -1 and recording.written == [b"a", b"b"]

"""Writing to a connection's socket: straight from the caller while its transport holds
nothing unsent, else through the transport.

A transport's write is a Python call into the event loop, and uvloop's its own bookkeeping
besides (a buffer, the socket's number asked again, a write queue): about 1,000 instructions a
write, two writes a request. A request's head and an answer's chunks are small and a
connection's socket buffer is nearly always empty, so the bytes are sent here, from C
(`send_now`), and the transport gets only what the socket did not take. From then on every
write goes through the transport until it has sent all it holds, so the bytes keep their
order; its flow control (pause_writing past its high-water mark) works as before, on what it
holds. A transport that is closing gets every write, as before: its socket may already be
closed, and its number taken by another connection."""

from __future__ import annotations

from router.protocol.wire import send_now


class Sender:
    """Attributes and `write` are typed in sender.pxd."""

    def __init__(self, transport) -> None:
        self.transport = transport
        self.spilled = False  # the transport holds bytes not yet sent
        sock = transport.get_extra_info("socket")
        plain = transport.get_extra_info("sslcontext") is None
        self.fd = sock.fileno() if sock is not None and plain else -1

    def write(self, data: bytes) -> None:
        transport = self.transport
        if self.fd >= 0 and not transport.is_closing():
            if self.spilled:
                if transport.get_write_buffer_size():
                    transport.write(data)
                    return
                self.spilled = False
            sent = send_now(self.fd, data)
            if sent == len(data):
                return
            self.spilled = True
            if sent > 0:
                data = data[sent:]
        transport.write(data)

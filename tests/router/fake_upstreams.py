"""Fake replicas for the faults a sim engine cannot produce, served from a thread of the test."""

import asyncio
import contextlib
import threading

from tests.harness import free_port


@contextlib.contextmanager
def serving(protocol_factory):
    """Serve `protocol_factory` on a loopback port while the block runs; yields its URL."""
    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()

    async def serve():
        server = await loop.create_server(protocol_factory, "127.0.0.1", port)
        ready.set()
        await stop.wait()
        server.close()
        await server.wait_closed()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(5)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
        loop.close()


class Relay:
    """A TCP relay to a local port that can be cut (connections reset, new ones refused) and
    healed: a network split between a router and its control plane. Or only its route watch
    stalled (`stall_routes`: watches reset, new ones refused, every other call relayed): a
    router that reports on a table it can no longer renew."""

    def __init__(self, loop, target_port: int, port: int) -> None:
        self.loop = loop
        self.target_port = target_port
        self.url = f"http://127.0.0.1:{port}"
        self.open: set = set()
        self.watching: set = set()  # the pairs whose last request was a route watch
        self.is_cut = False
        self.routes_stalled = False

    async def handle(self, reader, writer):
        if self.is_cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self.open.add(pair)

        async def pipe(source, sink, upstream=False):
            try:
                while data := await source.read(65536):
                    if upstream and data.startswith(b"GET /v1/routes"):
                        if self.routes_stalled:
                            break
                        self.watching.add(pair)
                    elif upstream and data[:4] in (b"GET ", b"POST", b"PUT ", b"DELE"):
                        self.watching.discard(pair)
                    sink.write(data)
                    await sink.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer, upstream=True), pipe(up_reader, writer))
        self.open.discard(pair)
        self.watching.discard(pair)

    def _cut(self):
        self.is_cut = True
        for writer, up_writer in list(self.open):
            writer.transport.abort()
            up_writer.transport.abort()

    def _stall_routes(self):
        self.routes_stalled = True
        for writer, up_writer in list(self.watching):
            writer.transport.abort()
            up_writer.transport.abort()

    def stall_routes(self) -> None:
        self.loop.call_soon_threadsafe(self._stall_routes)

    def cut(self) -> None:
        self.loop.call_soon_threadsafe(self._cut)

    def heal(self) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "is_cut", False)


@contextlib.contextmanager
def relaying(target_port: int):
    port = free_port()
    loop = asyncio.new_event_loop()
    relay = Relay(loop, target_port, port)
    ready = threading.Event()
    stop = asyncio.Event()

    async def serve():
        server = await asyncio.start_server(relay.handle, "127.0.0.1", port)
        ready.set()
        await stop.wait()
        relay._cut()
        server.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(5)
    try:
        yield relay
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)

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

"""An agent's watch of its orders parked on a frozen server ends as soon as its heartbeats
move on, as a router's route watch is bounded by the lease."""

import asyncio
import socket
import time

import aiohttp
import pytest
from aiohttp import web

from controlplane.agent.agent import ControlPlaneClient, ServerMoved


def frozen_server() -> socket.socket:
    """Accepts connections and never answers: a leader stopped with SIGSTOP."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server


def test_a_watch_on_a_frozen_server_ends_when_the_client_moves_on():
    frozen = frozen_server()

    async def scenario():
        app = web.Application()

        async def assignments(request):
            return web.json_response({"digest": "d2", "assignments": []})

        app.router.add_get("/v1/nodes/n1/assignments", assignments)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        good = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        stuck = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        async with aiohttp.ClientSession() as session:
            client = ControlPlaneClient(session, f"{stuck},{good}", None)
            parked = asyncio.ensure_future(
                client.watch("/v1/nodes/n1/assignments", None, 65.0, digest="d1", wait="60")
            )
            await asyncio.sleep(0.3)
            assert not parked.done(), "parked on the frozen server"
            began = time.monotonic()
            client._failed(stuck)  # a heartbeat to it timed out: the client moves on
            with pytest.raises(ServerMoved):
                await asyncio.wait_for(parked, 1.0)
            assert time.monotonic() - began < 0.5
            answer = await client.watch("/v1/nodes/n1/assignments", None, 5.0, digest="d1")
            assert answer["digest"] == "d2", "the next watch goes where the client is now"
        await runner.cleanup()

    try:
        asyncio.run(scenario())
    finally:
        frozen.close()

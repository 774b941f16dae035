"""A router's list of control planes: a failure moves on from the server that failed, once,
however many calls failed on it together (the route watch and the activity report on one
frozen leader), so the list never walks back to it."""

import asyncio

from controlplane.agent.agent import ControlPlaneClient
from router.control.leader import ControlPlanes


def test_two_calls_failing_on_one_server_move_the_router_once():
    servers = ControlPlanes("http://a:1,http://b:1")
    watch_on, report_on = servers.url, servers.url  # both made to a, which froze
    servers.failed(watch_on)
    servers.failed(report_on)
    assert servers.url == "http://b:1", "the second failure was a's too: it stays on b"
    servers.failed("http://b:1")
    assert servers.url == "http://a:1", "b failing in turn moves it on"


class Refusing:
    """An aiohttp session whose every call times out a moment later, as on a frozen server."""

    def __init__(self) -> None:
        self.tried: list[str] = []

    def request(self, method, url, **kw):
        self.tried.append(url)
        return self

    async def __aenter__(self):
        await asyncio.sleep(0.01)
        raise TimeoutError

    async def __aexit__(self, *exc):
        return False


def test_heartbeats_failing_together_on_one_server_move_the_agent_once():
    session = Refusing()
    client = ControlPlaneClient(session, "http://a:1,http://b:1", None)

    async def many_at_once():
        beats = [client.post(f"/v1/nodes/n{i}/heartbeat", {}) for i in range(1000)]
        return await asyncio.gather(*beats, return_exceptions=True)

    failures = asyncio.run(many_at_once())
    assert all(isinstance(f, TimeoutError) for f in failures)
    assert all(url.startswith("http://a:1") for url in session.tried), "all were in flight on a"
    assert client.base_url == "http://b:1", "a thousand failures on a move it once, to b"

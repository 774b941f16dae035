"""An agent's loop ends on the stop's cancel even when news came in the same turn: Python 3.11's
asyncio.wait_for returned as if not cancelled then, and the heartbeats went on for ever (an
agent that ignored SIGTERM under `gpuctl up`)."""

import asyncio
import types

import pytest

from controlplane.agent.agent import NodeAgent


def test_the_wait_for_the_next_beat_ends_on_a_cancel_that_meets_news():
    agent = NodeAgent.__new__(NodeAgent)  # the wait needs no control plane
    agent.heartbeat_s = 30.0
    agent.supervisor = types.SimpleNamespace(news=asyncio.Event())

    async def scenario():
        waiting = asyncio.create_task(agent._until_next_beat())
        await asyncio.sleep(0)  # it waits on the news
        agent.supervisor.news.set()  # an engine woke...
        waiting.cancel()  # ...and SIGTERM's stop came in the same turn
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())

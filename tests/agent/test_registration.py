"""An agent that cannot register waits between tries, whatever the control plane answered."""

import asyncio

from controlplane.agent import agent as agent_module
from controlplane.agent.agent import ControlPlaneError, NodeAgent


class Inventory:
    name = "n1"

    def describe(self):
        return {"name": "n1"}

    def health(self):
        return []


class RefusingThenAccepting:
    def __init__(self, refusals):
        self.refusals = list(refusals)
        self.calls = 0

    async def post(self, path, body, token=None):
        self.calls += 1
        if self.refusals:
            raise self.refusals.pop(0)
        return {}


def test_refusals_and_failures_alike_back_off(monkeypatch):
    waits = []

    async def sleep(seconds):
        waits.append(seconds)

    monkeypatch.setattr(agent_module.asyncio, "sleep", sleep)
    refusals = [ControlPlaneError(503, "busy"), ControlPlaneError(500, "oops"), OSError("down")]
    refusals += [ControlPlaneError(503, "busy")] * 5
    client = RefusingThenAccepting(refusals)
    asyncio.run(NodeAgent(Inventory(), None, client).register())
    assert client.calls == 9
    assert waits == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]

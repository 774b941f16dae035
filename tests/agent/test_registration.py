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

    def replica_memory(self, running):
        return {}

    def refuse_over(self, running, stopping):
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


class LosesTheFirstAnswer:
    """A control plane with a token file that registers the node, then loses the answer (the
    agent's call timed out under load); it knows credentials by their SHA-256 alone."""

    token = "agt-1"  # the agent's bootstrap token

    def __init__(self) -> None:
        self.kept: str | None = None  # the node's credential digest, once registered
        self.calls: list[tuple[str, str | None]] = []

    async def post(self, path, body, token=None):
        from controlplane.vocabulary.auth import digest

        self.calls.append((path, token))
        if path == "/v1/nodes":
            if token is None:  # the bootstrap token
                if self.kept is not None:
                    raise ControlPlaneError(403, "node n1 is registered with its own credential")
                self.kept = body["credential_sha256"]
                raise TimeoutError  # registered, and the answer never came
            if digest(token) != self.kept:
                raise ControlPlaneError(401, "unknown token")
            return {"name": "n1"}
        assert digest(token) == self.kept, "a heartbeat with the node's own credential"
        return {"assignments": []}


def test_a_registration_whose_answer_was_lost_leaves_the_agent_its_credential(
    monkeypatch, tmp_path
):
    async def sleep(seconds):
        pass

    monkeypatch.setattr(agent_module.asyncio, "sleep", sleep)
    client = LosesTheFirstAnswer()
    credential = agent_module.Credential(tmp_path / "credential")
    node = NodeAgent(Inventory(), supervisor=None, client=client, credential=credential)
    asyncio.run(asyncio.wait_for(node.register(), 5))
    token = credential.read()
    assert token is not None and not credential.pending.exists()
    assert client.calls[-1] == ("/v1/nodes", token), "it registered again as itself"
    assert (tmp_path / "credential").stat().st_mode & 0o077 == 0, "readable by its user alone"

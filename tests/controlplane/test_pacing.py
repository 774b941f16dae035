"""Heartbeats paced by the fleet's size: a large fleet's nodes beat less often and are judged
on the period they were told, a small fleet's as before."""

import asyncio
import subprocess

from hypothesis import given
from hypothesis import strategies as st

from controlplane.agent.agent import NodeAgent
from controlplane.rules.pacing import MISSED, HeartbeatPacing
from controlplane.tick.reconciler import Reconciler
from tests.controlplane.conftest import make_node
from tests.harness import BIN, call, control_plane


def test_the_period_grows_with_the_fleet_past_the_rate_the_server_takes():
    pacing = HeartbeatPacing(period_s=2.0, max_per_s=500.0, timeout_s=15.0)
    assert pacing.period(4) == 2.0 and pacing.timeout(4) == 15.0
    assert pacing.period(1000) == 2.0
    assert pacing.period(16_000) == 32.0
    assert pacing.timeout(16_000) == MISSED * 32.0


@given(st.integers(0, 100_000), st.floats(0, 1000))
def test_the_fleet_rate_is_bounded_and_a_node_is_judged_on_what_it_was_told(nodes, told):
    pacing = HeartbeatPacing()
    assert nodes / pacing.period(nodes) <= pacing.max_per_s + 1e-9
    assert pacing.timeout(nodes, told) >= max(pacing.timeout_s, MISSED * told)
    assert pacing.timeout(nodes, told) > pacing.period(nodes)


def test_a_node_told_a_long_period_is_not_lost_on_a_small_fleets_timeout(make_fleet, clock):
    fleet, _ = make_fleet()
    reconciler = Reconciler(fleet, node_timeout_s=15, heartbeat_s=2, max_heartbeats_per_s=1)
    for name in ("n1", "n2"):
        fleet.register(make_node(name, gpus=1))
    # Two nodes at one heartbeat a second: a period of 2 s, and n1 was told 30 s earlier on.
    fleet.nodes["n1"].heartbeat_s = 30.0
    clock.advance(16)
    reconciler.tick()
    assert fleet.nodes["n1"].ready, "told 30 s: NotReady only after 4 of those"
    assert not fleet.nodes["n2"].ready, "told nothing: the small fleet's 15 s"
    clock.advance(4 * 30 - 16)
    reconciler.tick()
    assert fleet.nodes["n1"].ready
    clock.advance(1)
    reconciler.tick()
    assert not fleet.nodes["n1"].ready


def test_the_server_hands_each_agent_its_period_and_a_bad_pacing_is_refused(procs, tmp_path):
    url, _ = control_plane(
        procs, tmp_path / "state.sqlite", None, "--max-heartbeats-per-second", "1"
    )
    for name in ("n1", "n2", "n3"):
        assert call("POST", url + "/v1/nodes", make_node(name, gpus=1))[0] == 201
    status, answer = call("POST", url + "/v1/nodes/n1/heartbeat", {"replicas": {}})
    assert status == 200 and answer["heartbeat_s"] == 3.0, answer  # 3 nodes at 1 a second
    assert call("POST", url + "/v1/nodes/n4/heartbeat", {"replicas": {}})[0] == 404
    assert len(call("GET", url + "/v1/nodes")[1]["items"]) == 3
    done = subprocess.run(
        [str(BIN / "gpuctl"), "server", "--heartbeat", "20", "--node-timeout", "15"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "--node-timeout must be longer" in done.stderr


class OneAnswer:
    """A control plane that answers every heartbeat with `answer`."""

    session = None

    def __init__(self, answer: dict) -> None:
        self.answer = answer

    async def post(self, path, body, token=None):
        return self.answer


class Quiet:
    def __init__(self) -> None:
        self.applied = []
        self.running = {}
        self.stopping = {}

    async def check(self, session) -> None:
        pass

    def reports(self) -> dict:
        return {}

    def reconcile(self, assignments) -> None:
        self.applied.append(assignments)


class Node:
    name = "n1"

    def health(self) -> list:
        return []

    def replica_memory(self, running) -> dict:
        return {}

    def refuse_over(self, running, stopping) -> list:
        return []


def test_an_agent_beats_at_the_period_its_control_plane_hands_out():
    answer = {"assignments": [], "orders": "a.1", "digest": "d", "heartbeat_s": 32.0}
    agent = NodeAgent(Node(), Quiet(), OneAnswer(answer), heartbeat_s=2.0)
    asyncio.run(agent.beat())
    assert agent.heartbeat_s == 32.0
    for nonsense in (0, -1, "5", None, float("nan"), float("inf")):
        kept = NodeAgent(Node(), Quiet(), OneAnswer({**answer, "heartbeat_s": nonsense}), 2.0)
        asyncio.run(kept.beat())
        assert kept.heartbeat_s == 2.0, f"{nonsense!r} is no period: ignored"

"""An agent hears its orders as soon as a tick decides them: the watch of its assignments,
against a real `gpuctl server`, and the agent's rule for answers that cross on the way."""

import json
import threading
import time

import pytest

from controlplane.agent.agent import NodeAgent, older
from tests.controlplane.conftest import make_node, spec
from tests.harness import call, control_plane, wait_until

pytestmark = pytest.mark.integration
ASSIGNMENTS = "/v1/nodes/n1/assignments"


@pytest.fixture
def server(procs, tmp_path):
    url, _ = control_plane(procs, tmp_path / "state.sqlite")
    status, _ = call("POST", url + "/v1/nodes", make_node("n1", gpus=2))
    assert status == 201
    return url


def heartbeat(url: str) -> dict:
    status, answer = call("POST", url + "/v1/nodes/n1/heartbeat", {"replicas": {}})
    assert status == 200, answer
    return answer


def test_a_parked_watch_answers_with_the_replica_a_tick_placed(server):
    held = heartbeat(server)
    assert held["assignments"] == [] and held["digest"] and held["orders"]
    answers = []
    watch = threading.Thread(
        target=lambda: answers.append(
            call("GET", f"{server}{ASSIGNMENTS}?digest={held['digest']}&wait=120", timeout=130)
        )
    )
    watch.start()
    assert call("POST", server + "/v1/models", spec(name="m", replicas=1))[0] in (200, 201)
    watch.join(timeout=60)  # no heartbeat is sent meanwhile: only the watch can tell
    assert not watch.is_alive(), "the watch answered once the tick placed the replica"
    ((status, answer),) = answers
    assert status == 200, answer
    (assignment,) = answer["assignments"]
    assert assignment["model"] == "m"
    assert answer["digest"] != held["digest"]
    assert not older(answer["orders"], held["orders"])


def test_a_watch_with_nothing_new_answers_what_the_agent_holds_at_its_end(server):
    held = heartbeat(server)
    status, answer = call("GET", f"{server}{ASSIGNMENTS}?digest={held['digest']}&wait=0.5")
    assert status == 200, answer
    assert (answer["assignments"], answer["digest"]) == ([], held["digest"])


@pytest.mark.parametrize("wait", ["soon", "nan", "-1", "301"])
def test_a_bad_wait_is_refused_with_the_field_named_and_changes_nothing(server, wait):
    before = call("GET", server + "/v1/nodes/n1")[1]
    status, answer = call("GET", f"{server}{ASSIGNMENTS}?digest=00&wait={wait}")
    assert status == 400, answer
    assert answer["error"]["param"] == "wait"
    after = call("GET", server + "/v1/nodes/n1")[1]
    assert after == before


def test_the_watch_of_an_unknown_node_is_404(server):
    status, answer = call("GET", f"{server}/v1/nodes/n9/assignments?digest=00&wait=5")
    assert status == 404, answer


class Recorder:
    def __init__(self) -> None:
        self.applied: list[list] = []

    def reconcile(self, assignments) -> None:
        self.applied.append(assignments)


def test_an_answer_older_than_the_orders_held_is_not_applied():
    agent = NodeAgent(inventory=None, supervisor=Recorder(), client=None)
    assert agent.take_orders({"assignments": ["new"], "orders": "ab12.7", "digest": "d7"})
    # A heartbeat's answer computed before the watch's, arriving after it: dropped.
    assert not agent.take_orders({"assignments": [], "orders": "ab12.5", "digest": "d5"})
    assert agent.take_orders({"assignments": ["same"], "orders": "ab12.7", "digest": "d7"})
    # Another leader's term: its orders count as news, whatever its counter.
    assert agent.take_orders({"assignments": ["next"], "orders": "ff00.1", "digest": "e1"})
    assert agent.supervisor.applied == [["new"], ["same"], ["next"]]
    assert (agent.orders, agent.digest) == ("ff00.1", "e1")


HEARTBEAT_S = 300.0  # far beyond any wait below: only the watch can bring the order sooner


def test_an_agent_starts_what_a_tick_placed_long_before_its_next_heartbeat(procs, tmp_path):
    """Heartbeats five minutes apart: a replica placed just after one is started (and reported
    Starting, by a heartbeat brought forward) while the next is still far off. (With
    `--watch 0` it waits for that heartbeat, and this fails.)"""
    url, _ = control_plane(
        procs,
        tmp_path / "state.sqlite",
        None,
        "--node-timeout",
        "900",
        "--heartbeat",
        str(HEARTBEAT_S),
    )
    fleet_file = tmp_path / "fleet.yaml"
    one_node = {"name": "ib-a", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 2}
    fleet_file.write_text(json.dumps({"fabrics": [one_node]}))
    procs.start(
        [
            "gpuctl", "agent", "--server", url, "--simulate", str(fleet_file),
            "--state-dir", str(tmp_path / "agent"), "--heartbeat", str(HEARTBEAT_S),
        ],
        name="agent",
    )  # fmt: skip
    wait_until(lambda: call("GET", url + "/v1/summary")[1]["nodes"]["ready"] == 1, what="node")
    time.sleep(1.0)  # its first heartbeat, right after registering, is answered
    sim = ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}"]
    assert call("POST", url + "/v1/models", spec(name="m", command=sim))[0] == 201

    def reported() -> list[str]:
        rows = call("GET", url + "/v1/replicas")[1]["items"]
        return [r["state"] for r in rows if r["state"] in ("Starting", "Ready")]

    wait_until(reported, timeout=60, what="the replica started by its agent")

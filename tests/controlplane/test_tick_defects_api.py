"""The tick's defects as an operator meets them: a real `gpuctl server`, called over HTTP by
a pretend agent (heartbeats) and a pretend router (route watch and activity reports)."""

import pytest

from tests.controlplane.conftest import make_node, spec
from tests.harness import call, control_plane, wait_until

pytestmark = pytest.mark.integration


class Fleet:
    """One node's agent and one router, each saying what the test tells it to."""

    def __init__(self, url: str, gpus: int) -> None:
        self.url = url
        status, _ = call("POST", url + "/v1/nodes", make_node("n1", gpus=gpus))
        assert status == 201

    def heartbeat(self, states: dict[str, str]) -> list[dict]:
        body = {
            "replicas": {
                rid: {"state": state, "url": f"http://127.0.0.1:{9000 + i}"}
                for i, (rid, state) in enumerate(sorted(states.items()))
            }
        }
        status, answer = call("POST", self.url + "/v1/nodes/n1/heartbeat", body)
        assert status == 200, answer
        return answer["assignments"]

    def assignments(self) -> list[dict]:
        return call("GET", self.url + "/v1/nodes/n1/assignments")[1]["assignments"]

    def assigned(self) -> list[str]:
        return sorted(a["replica"] for a in self.assignments())

    def route_version(self) -> int:
        return call("GET", self.url + "/v1/routes")[1]["version"]

    def report(self, watched: dict[str, float], in_flight: dict[str, int] | None = None):
        body = {
            "router": "r1",
            "incarnation": "i1",
            "uptime_s": 1000,
            "route_version": self.route_version(),
            "used": {},
            "watched": watched,
            "in_flight": in_flight or {},
        }
        status, answer = call("POST", self.url + "/v1/activity", body)
        assert status == 200, answer

    def replicas(self) -> dict[str, dict]:
        return {r["id"]: r for r in call("GET", self.url + "/v1/replicas")[1]["items"]}

    def ready(self, count: int) -> list[str]:
        """Waits for `count` assignments, and reports their replicas Ready."""
        ids = wait_until(
            lambda: (ids := self.assigned()) and len(ids) == count and ids,
            what=f"{count} assignments",
        )
        self.heartbeat(dict.fromkeys(ids, "Ready"))
        wait_until(
            lambda: all(r["state"] == "Ready" for r in self.replicas().values()),
            what="Ready replicas",
        )
        return ids


@pytest.fixture
def server(procs, tmp_path):
    url, _ = control_plane(procs, tmp_path / "state.sqlite")
    return url


def test_scaling_down_through_the_api_withdraws_an_unhealthy_replica_with_streams(server):
    fleet = Fleet(server, gpus=2)
    call("POST", server + "/v1/models", spec(replicas=2))
    a, b = fleet.ready(2)
    fleet.report({a: 1.0, b: 1.0}, in_flight={a: 2, b: 3})
    # b's probe fails under load: it still streams through the router.
    fleet.heartbeat({a: "Ready", b: "Unhealthy"})
    wait_until(lambda: fleet.replicas()[b]["state"] == "Unhealthy", what="b Unhealthy")
    status, _ = call("POST", server + "/v1/models/llama/scale", {"replicas": 1})
    assert status == 200
    leaving = wait_until(
        lambda: [r for r in fleet.replicas().values() if r["state"] not in ("Ready", "Unhealthy")],
        what="one replica on its way out",
    )
    assert [r["state"] for r in leaving] == ["Retiring"], leaving
    assert sorted(fleet.assigned()) == [a, b], "its agent keeps it running while it drains"
    fleet.report({a: 1.0, b: 1.0}, in_flight={a: 2, b: 3})
    assert fleet.replicas()[leaving[0]["id"]]["state"] == "Retiring", "streams keep it"
    (kept,) = {a, b} - {leaving[0]["id"]}
    fleet.report({kept: 1.0}, in_flight={kept: 2})  # a table without it, its streams ended
    wait_until(
        lambda: fleet.replicas()[leaving[0]["id"]]["state"] == "Stopping",
        what="the drained replica stopping",
    )


def test_scaling_to_the_spec_count_through_the_api_starts_a_model_at_zero(server):
    fleet = Fleet(server, gpus=1)
    call("POST", server + "/v1/models", spec(replicas=1, min_replicas=0))
    (a,) = fleet.ready(1)
    fleet.report({a: 30.0})  # watched for 30 s, unused
    status, answer = call("POST", server + "/v1/stop-idle", {"idle_after": "1s"})
    assert status == 200 and [s["id"] for s in answer["stopped"]] == [a], answer
    assert call("GET", server + "/v1/models/llama")[1]["desired"] == 0
    fleet.report({})  # a table without it, nothing in flight
    wait_until(lambda: fleet.replicas()[a]["state"] == "Stopping", what="a stopping")
    fleet.heartbeat({})  # its engine ended
    wait_until(lambda: a not in fleet.replicas(), what="a gone")
    status, answer = call("POST", server + "/v1/models/llama/scale", {"replicas": 1})
    assert status == 200, answer
    assert call("GET", server + "/v1/models/llama")[1]["desired"] == 1
    (started,) = wait_until(fleet.assignments, what="a replica placed again")
    assert started["replica"] != a

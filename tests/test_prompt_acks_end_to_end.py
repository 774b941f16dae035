"""A replica on its way out waits for every live router's acknowledgement, and a router
acknowledges a new route version at once, not at its next activity report: a scale-down
ends well before the router's next periodic report. Real processes: control plane, sim
agent, router."""

import time

import pytest

from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, wait_until

pytestmark = pytest.mark.integration
# Reports a minute apart, and a router counted live for two: a victim gone within half a
# minute was let go by a report sent at once, whatever the machine's load, where one that
# waited for the periodic report would take most of the minute.
ROUTER_TICK_S = 60.0
ROUTER_LIVE_S = 120.0
PROMPTLY_S = ROUTER_TICK_S / 2
SIM = ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}"]


def test_a_scale_down_stops_its_victim_before_the_routers_next_report(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path, server_args=("--router-live", str(ROUTER_LIVE_S)))
    call("POST", fleet.url + "/v1/models", spec(name="m", command=SIM, replicas=2))
    wait_until(lambda: len(fleet.replicas("Ready")) == 2, timeout=30, what="2 Ready")
    procs.router("--control-plane", fleet.url, "--tick", str(ROUTER_TICK_S))

    def routers() -> list[dict]:
        return call("GET", fleet.url + "/v1/routers")[1]["items"]

    # Live from its first periodic report, sent as it starts; the next is a minute later.
    wait_until(lambda: [r for r in routers() if r["state"] == "live"], what="the router live")
    asked = time.monotonic()
    assert call("POST", fleet.url + "/v1/models/m/scale", {"replicas": 1})[0] == 200
    wait_until(lambda: len(fleet.replicas()) == 1, timeout=PROMPTLY_S, what="the victim gone")
    took = time.monotonic() - asked
    (router_row,) = routers()
    assert router_row["state"] == "live", "its acknowledgement was waited for"
    assert took < PROMPTLY_S, f"{took:.1f} s: waited for the router's periodic report"

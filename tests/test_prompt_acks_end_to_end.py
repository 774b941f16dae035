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
ROUTER_TICK_S = 9.0  # reports this far apart; still live (the control plane's window is 10 s)
SIM = ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}"]


def test_a_scale_down_stops_its_victim_before_the_routers_next_report(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", spec(name="m", command=SIM, replicas=2))
    wait_until(lambda: len(fleet.replicas("Ready")) == 2, timeout=30, what="2 Ready")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", str(ROUTER_TICK_S))
    started = time.monotonic()  # periodic reports go at about started + k * ROUTER_TICK_S

    def routers() -> list[dict]:
        return call("GET", fleet.url + "/v1/routers")[1]["items"]

    wait_until(lambda: [r for r in routers() if r["state"] == "live"], what="the router live")
    # Just after a periodic report: the next is about ROUTER_TICK_S - 1 s away.
    phase = (time.monotonic() - started) % ROUTER_TICK_S
    time.sleep((1.0 - phase) % ROUTER_TICK_S)
    asked = time.monotonic()
    assert call("POST", fleet.url + "/v1/models/m/scale", {"replicas": 1})[0] == 200
    wait_until(lambda: len(fleet.replicas()) == 1, timeout=ROUTER_TICK_S, what="the victim gone")
    took = time.monotonic() - asked
    assert took < ROUTER_TICK_S - 4, f"{took:.1f} s: waited for the router's periodic report"
    (router_row,) = routers()
    assert router_row["state"] == "live", "its acknowledgement was waited for"

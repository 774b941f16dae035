"""Autoscaling reaction: a step from no load to 16 concurrent streams on one replica (target
4, max 4); from the step to the last new replica Ready, less the two ticks the rule takes to
double twice, over that replica's own engine start-up (placed to Ready), measured in the same
run. What is left is the report's lag, the decisions and the placement."""

import time

import pytest

from bench.figures import record
from tests.harness import call, wait_until
from tests.test_autoscale_end_to_end import TICK_S, Load, events, ready, start

pytestmark = pytest.mark.integration
STARTUP_S = 3.0  # as the swap gate: real engines take seconds to minutes


def test_scale_out_costs_little_beyond_the_engines_start_up(benchmark, procs, tmp_path):
    fleet, router = start(procs, tmp_path, startup_s=STARTUP_S)
    wait_until(lambda: ready(fleet) == 1, timeout=30, what="the first replica")
    wait_until(lambda: call("GET", fleet.url + "/v1/routes")[1]["routes"]["busy"], what="route")

    def step():
        stepped = time.time()
        load = Load(router, 16, tokens=120)  # 6 s a stream: the load outlasts the scale-out
        wait_until(lambda: ready(fleet) == 4, timeout=30, what="4 Ready replicas")
        return stepped, load

    stepped, load = benchmark.pedantic(step, rounds=1)
    rows = events(fleet)
    load.end()
    ready_at = {e["message"].split()[1]: e["at"] for e in rows if e["message"].endswith(" Ready")}
    placed_at = {e["message"].split()[1]: e["at"] for e in rows if " placed on " in e["message"]}
    new = [r for r in placed_at if placed_at[r] >= stepped]
    last = max(new, key=lambda r: ready_at[r])
    reaction = ready_at[last] - stepped
    startup = ready_at[last] - placed_at[last]
    ratio = (reaction - 2 * TICK_S) / startup
    benchmark.extra_info.update({"reaction_s": reaction, "startup_s": startup, "ratio": ratio})
    record(
        f"autoscale: 1 -> 4 replicas Ready {reaction:.2f} s after the step; the last one's"
        f" start-up {startup:.2f} s; (reaction - 2 ticks) / start-up {ratio:.2f}"
    )
    assert len(new) == 3
    assert ratio <= 1.5

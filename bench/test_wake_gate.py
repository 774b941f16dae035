"""Wake overhead: a model at zero, requests arrive; how much longer than the engine's own
start-up (placement to Ready) the first answer takes. Measured against that start-up in the
same run, so a slow machine slows both."""

import pytest

from bench.figures import record
from tests.agent.test_agent_sim import SimFleet
from tests.harness import call, post, wait_until
from tests.test_scale_to_zero_end_to_end import (
    CHAT,
    at_zero,
    sleepy_spec,
    started_in,
    wake_with,
)

pytestmark = pytest.mark.integration


def test_wake_costs_little_beyond_the_engines_start_up(benchmark, procs, tmp_path):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", sleepy_spec())
    wait_until(lambda: fleet.replicas("Ready"), timeout=30, what="the first replica")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    wait_until(lambda: post(router + "/v1/chat/completions", CHAT)[0] == 200, what="a route")
    wait_until(lambda: at_zero(fleet), timeout=30, what="the model at zero")
    statuses, first_answer = benchmark.pedantic(wake_with, args=(router, 20), rounds=1)
    assert statuses == [200] * 20
    startup = started_in(fleet)
    ratio = first_answer / startup
    benchmark.extra_info.update({"startup_s": startup, "first_answer_s": first_answer})
    record(
        f"wake: first answer {first_answer:.2f} s after the requests, engine start-up"
        f" {startup:.2f} s: overhead {1000 * (first_answer - startup):.0f} ms, ratio {ratio:.2f}"
    )
    assert ratio <= 1.5

"""What reading the engines' load costs one router at 1,000 idle replicas and the default
interval (bench/reader_cost.py: the router's CPU with the reader on, less the same router with
it off, in one run):

- quiet engines back off: at most one read of each every QUIET_MOST_S, and a quarter more for
  the engines still backing off and the rounds' jitter;
- the reader costs at most 0.03 of a core (not reached: an expected failure).
"""

import pytest

from bench.figures import record
from bench.reader_cost import run
from router.load.engineload import QUIET_MOST_S

REPLICAS = 1000
GOAL_OF_A_CORE = 0.03


@pytest.fixture(scope="module")
def idle():
    found = run(REPLICAS, seconds=10.0)
    record(
        f"engine-load reader at {REPLICAS} idle replicas, 0.1 s: {found['reader_cost_of_a_core']}"
        f" of a core (goal {GOAL_OF_A_CORE}; its own code {found['reader_own_code_of_a_core']});"
        f" {found['reads_per_s']} reads/s, every read {found['reads']}"
    )
    return found


def test_quiet_engines_are_read_once_in_their_quiet_period(idle):
    assert idle["reads_ok"] > 0, idle
    assert idle["reads_per_s"] <= 1.25 * REPLICAS / QUIET_MOST_S, idle
    assert idle["reads_ok"] == sum(idle["reads"].values()), "every read answered"


@pytest.mark.xfail(
    strict=True,
    reason="not reached: 0.034-0.042 of a core at 500 reads/s (0.048-0.053 while its targets"
    " were rebuilt twice a second). About 80 µs of the router's CPU a read: 9 µs of the reader's"
    " Python, about 40 µs in the write of each request (the loopback write runs the engine's"
    " side of TCP and its wake-up on this core) and the rest the loop's wake-up and read; 0.03"
    " needs fewer reads (quiet engines every 2.7 s or more), not faster code",
)
def test_the_reader_costs_at_most_three_hundredths_of_a_core(idle):
    assert idle["reader_cost_of_a_core"] <= GOAL_OF_A_CORE, idle

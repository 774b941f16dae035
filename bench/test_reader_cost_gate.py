"""What reading the engines' load costs one router at 1,000 idle replicas and the default
interval (bench/reader_cost.py: the router's CPU with the reader on, less the same router with
it off, in one run):

- quiet engines back off: at most one read of each every QUIET_MOST_S, and a quarter more for
  the engines still backing off and the rounds' jitter;
- the reader costs at most 0.03 of a core: 0.014-0.015 on an AMD EPYC (Zen 5), quiet
  engines read every 3 s (0.021 at every 2 s there, and 0.031-0.042 at 2 s on slower machines:
  60-85 µs of the router's CPU a read, most of it the loopback write, which runs the engine's
  side of TCP on this core).
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


def test_the_reader_costs_at_most_three_hundredths_of_a_core(idle):
    assert idle["reader_cost_of_a_core"] <= GOAL_OF_A_CORE, idle

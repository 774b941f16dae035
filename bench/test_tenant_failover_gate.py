"""A tenant held at its limits through a leader kill -9, at four routers
(bench/tenant_failover.py, one run): in flight never above `max_in_flight` (the engines' own
count, give or take the one request the sampling of two engines may count twice) nor below
90% of it over any second; the admitted rate within 90% of its limit and the limit (give or
take one request a window) in every 10 s window; nothing lost."""

import pytest

from bench.figures import record
from bench.tenant_failover import WINDOW_S, measure


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    found = measure(tmp_path_factory.mktemp("failover"), before_s=15.0, after_s=25.0)
    record(
        f"tenants through a leader kill -9 at {found['routers']} routers (took over in"
        f" {found['took_over_s']} s): in flight {found['held_fewest_second']}-"
        f"{found['held_most']} of {found['held_limit']} (fewest second after the kill"
        f" {found['held_fewest_second_after_kill']}); admitted"
        f" {found['rated_fewest_per_min']:.0f}-{found['rated_most_per_min']:.0f}/min of"
        f" {found['rated_limit_per_min']} by {WINDOW_S:.0f} s window"
    )
    return found


def test_in_flight_holds_the_limit_through_a_failover_and_never_passes_it(result):
    limit = result["held_limit"]
    assert result["held_most"] <= limit + 1, result
    assert result["held_fewest_second"] >= 0.9 * limit, result


def test_the_admitted_rate_holds_its_limit_through_a_failover(result):
    limit = result["rated_limit_per_min"]
    one_request = 60.0 / WINDOW_S
    assert result["rated_fewest_per_min"] >= 0.9 * limit, result
    assert result["rated_most_per_min"] <= limit + one_request, result


def test_nothing_is_lost_through_a_failover(result):
    assert result["lost"] == 0 and set(result["statuses"]) <= {200, 429}, result

"""How popular each replica is (controlplane/vocabulary/rates.py): counters routers report,
turned into requests a second over a recent window."""

import math

import pytest

from controlplane.vocabulary.idle import IdleTracker
from controlplane.vocabulary.rates import RequestRates


def test_a_routers_first_report_counts_nothing_then_growth_counts():
    rates = RequestRates(window_s=60.0)
    rates.take("r1", "i1", {"a": 500}, now=0.0)
    assert rates.rate("a", 0.0) == 0.0, "500 sent before: no burst now"
    rates.take("r1", "i1", {"a": 530}, now=2.0)
    assert rates.rate("a", 2.0) == pytest.approx(30 / 60)


def test_routers_add_up_and_a_counter_that_went_back_counts_its_new_value():
    rates = RequestRates(window_s=60.0)
    for router in ("r1", "r2"):
        rates.take(router, "i1", {"a": 10}, now=0.0)
    rates.take("r1", "i1", {"a": 16}, now=1.0)
    rates.take("r2", "i1", {"a": 4}, now=1.0)  # its slot was made anew
    assert rates.rate("a", 1.0) == pytest.approx(10 / 60)


def test_a_new_incarnation_starts_over_and_old_bursts_fade():
    rates = RequestRates(window_s=60.0)
    rates.take("r1", "i1", {"a": 0}, now=0.0)
    rates.take("r1", "i1", {"a": 60}, now=1.0)
    rates.take("r1", "i2", {"a": 9_000}, now=2.0)  # restarted: its counter's past is unknown
    assert rates.rate("a", 2.0) == pytest.approx(math.exp(-1 / 60))
    assert rates.rate("a", 2.0 + 600) < 1e-4
    assert rates.rates(2.0 + 6000) == {}, "faded to nothing: forgotten"


def test_an_activity_report_feeds_the_rates_and_adapters_count_for_their_replica():
    now = [1000.0]
    tracker = IdleTracker(clock=lambda: now[0])
    report = {"router": "r1", "incarnation": "i1", "uptime_s": 5, "used": {}, "watched": {},
              "requests": {"b-1": 1, "b-1@sql": 1}}  # fmt: skip
    tracker.report(report)
    now[0] += 2
    tracker.report({**report, "requests": {"b-1": 7, "b-1@sql": 7}})
    assert tracker.rates.rate("b-1", now[0]) == pytest.approx(12 / 60)


def test_a_bad_requests_map_is_refused():
    tracker = IdleTracker()
    with pytest.raises(ValueError, match="requests"):
        tracker.report({"router": "r1", "uptime_s": 1, "used": {}, "watched": {},
                        "requests": {"a": -1}})
    assert tracker.rates.counters == {}

import pytest

from controlplane.idle import IdleState, IdleTracker, ReportError
from tests.controlplane.conftest import Clock


def report(router, used=None, watched=None, uptime=100.0):
    return {"router": router, "uptime_s": uptime, "used": used or {}, "watched": watched or {}}


def test_exact_when_some_router_saw_a_use_and_newest_wins():
    clock = Clock()
    idle = IdleTracker(clock=clock)
    idle.report(report("r1", used={"a": 50}, watched={"a": 300}))
    idle.report(report("r2", used={"a": 20}, watched={"a": 300}))
    idle.report(report("r1", used={"a": 50}, watched={"a": 300}))  # older news loses
    clock.advance(10)
    assert idle.idle_for("a") == (30.0, IdleState.EXACT)


def test_at_least_needs_every_live_router_to_have_watched_that_long():
    clock = Clock()
    idle = IdleTracker(clock=clock)
    idle.report(report("r1", watched={"a": 600}))
    idle.report(report("r2", watched={"a": 40}))
    assert idle.idle_for("a") == (40.0, IdleState.AT_LEAST)
    clock.advance(5)
    assert idle.idle_for("a") == (45.0, IdleState.AT_LEAST)


def test_a_router_restart_nominates_nothing():
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=10)
    idle.report(report("r1", watched={"a": 3600, "b": 3600}, used={"b": 5}))
    idle.report(report("r1-restarted", watched={"a": 2, "b": 2}, uptime=2))
    assert idle.idle_for("a") == (2.0, IdleState.AT_LEAST)
    clock.advance(11)
    idle.report(report("r1-restarted", watched={"a": 13, "b": 13}, uptime=13))
    assert idle.idle_for("a") == (13.0, IdleState.AT_LEAST)
    assert idle.idle_for("b") == (16.0, IdleState.EXACT)


def test_no_live_router_means_unknown_never_zero():
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=10)
    assert idle.idle_for("a") == (-1.0, IdleState.UNKNOWN)
    idle.report(report("r1", used={"a": 1}, watched={"a": 100}))
    clock.advance(30)
    assert idle.idle_for("a") == (-1.0, IdleState.UNKNOWN)
    assert idle.idle_for("never-watched")[1] == IdleState.UNKNOWN


@pytest.mark.parametrize(
    "body, field",
    [
        ([], "report"),
        ({"uptime_s": 1, "used": {}, "watched": {}}, "router"),
        (report("r", uptime=-1), "uptime_s"),
        ({**report("r"), "used": {"a": -3}}, "used"),
        ({**report("r"), "watched": None}, "watched"),
        ({**report("r"), "used": {"a": True}}, "used"),
    ],
)
def test_malformed_reports_are_refused_and_change_nothing(body, field):
    idle = IdleTracker(clock=Clock())
    idle.report(report("good", used={"a": 5}, watched={"a": 10}))
    before = (dict(idle.last_used_at), set(idle.routers))
    with pytest.raises(ReportError) as refused:
        idle.report(body)
    assert refused.value.field == field
    assert (dict(idle.last_used_at), set(idle.routers)) == before

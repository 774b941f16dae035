import pytest

from controlplane.vocabulary.idle import IdleState, IdleTracker, ReportError
from tests.controlplane.conftest import Clock


def report(router, used=None, watched=None, uptime=100.0, incarnation="i1", goodbye=False):
    body = {
        "router": router,
        "incarnation": incarnation,
        "uptime_s": uptime,
        "used": used or {},
        "watched": watched or {},
    }
    if goodbye:
        body["goodbye"] = True
    return body


def test_exact_when_some_router_saw_a_use_and_newest_wins():
    clock = Clock()
    idle = IdleTracker(clock=clock)
    idle.report(report("r1", used={"a": 50}, watched={"a": 300}))
    idle.report(report("r2", used={"a": 20}, watched={"a": 300}))
    idle.report(report("r1", used={"a": 50}, watched={"a": 300}))  # older news loses
    clock.advance(10)
    assert idle.idle_for("a") == (20.0, IdleState.EXACT), "known as of the last reports"
    idle.report(report("r1", used={"a": 60}, watched={"a": 310}))
    idle.report(report("r2", used={"a": 30}, watched={"a": 310}))
    assert idle.idle_for("a") == (30.0, IdleState.EXACT)


def test_at_least_needs_every_live_router_to_have_watched_that_long():
    clock = Clock()
    idle = IdleTracker(clock=clock)
    idle.report(report("r1", watched={"a": 600}))
    idle.report(report("r2", watched={"a": 40}))
    assert idle.idle_for("a") == (40.0, IdleState.AT_LEAST)
    clock.advance(5)
    assert idle.idle_for("a") == (40.0, IdleState.AT_LEAST), "nothing known since the reports"
    idle.report(report("r1", watched={"a": 605}))
    idle.report(report("r2", watched={"a": 45}))
    assert idle.idle_for("a") == (45.0, IdleState.AT_LEAST)


def test_a_crash_restart_nominates_nothing_and_leaves_a_gap():
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=10)
    idle.report(report("r1", watched={"a": 3600, "b": 3600}, used={"b": 5}))
    clock.advance(3)  # kill -9, and a new incarnation 2 s old reports
    idle.report(report("r1", watched={"a": 2, "b": 2}, uptime=2, incarnation="i2"))
    assert idle.states() == {"r1": "live"}
    assert idle.idle_for("a") == (2.0, IdleState.AT_LEAST)
    # b was last seen used 8 s ago, but the dead incarnation may have used it after its last
    # report: only the time since the gap's end is known.
    assert idle.idle_for("b") == (2.0, IdleState.AT_LEAST)
    clock.advance(11)
    idle.report(report("r1", watched={"a": 13, "b": 13}, uptime=13, incarnation="i2"))
    assert idle.idle_for("a") == (13.0, IdleState.AT_LEAST)
    assert idle.idle_for("b") == (13.0, IdleState.AT_LEAST)
    idle.report(report("r1", watched={"a": 13, "b": 13}, used={"b": 1}, incarnation="i2"))
    assert idle.idle_for("b") == (1.0, IdleState.EXACT)


def test_a_goodbye_hands_the_watch_to_the_next_incarnation():
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=10)
    idle.report(report("r1", watched={"a": 600, "b": 600}, used={"b": 30}))
    idle.report(report("r1", watched={"a": 600, "b": 600}, used={"b": 30}, goodbye=True))
    assert idle.states() == {"r1": "gone"}
    assert idle.idle_for("a")[1] == IdleState.UNKNOWN  # nobody routes to it now
    clock.advance(5)
    idle.report(report("r1", watched={"a": 1, "b": 1}, uptime=1, incarnation="i2"))
    assert idle.idle_for("a") == (605.0, IdleState.AT_LEAST)
    assert idle.idle_for("b") == (35.0, IdleState.EXACT)


def test_the_handover_waits_for_the_successors_table():
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=10)
    idle.report(report("r1", watched={"a": 600}))
    idle.report(report("r1", watched={"a": 600}, goodbye=True))
    clock.advance(2)
    idle.report(report("r1", watched={}, uptime=1, incarnation="i2"))  # before its routes
    clock.advance(1)
    idle.report(report("r1", watched={"a": 1}, uptime=2, incarnation="i2"))
    assert idle.idle_for("a") == (603.0, IdleState.AT_LEAST)


def test_a_silent_router_makes_its_replicas_unknown_until_it_reports_again():
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=10)
    idle.report(report("cut", watched={"a": 600}, used={"a": 300}))
    idle.report(report("other", watched={"a": 600, "b": 600}))
    clock.advance(8)
    idle.report(report("other", watched={"a": 608, "b": 608}))
    clock.advance(8)  # "cut" is silent now, "other" still live
    idle.report(report("other", watched={"a": 616, "b": 616}))
    assert idle.states() == {"cut": "silent", "other": "live"}
    assert idle.idle_for("a") == (-1.0, IdleState.UNKNOWN)
    assert idle.idle_for("b") == (616.0, IdleState.AT_LEAST)
    assert idle.unknown_because_silent(["a", "b"]) == {"a"}
    clock.advance(600)  # no timer turns silent into gone
    idle.report(report("other", watched={"a": 1216, "b": 1216}))
    assert idle.idle_for("a")[1] == IdleState.UNKNOWN
    idle.report(report("cut", watched={"a": 1216}, used={"a": 2}))  # back, with its uses
    assert idle.idle_for("a") == (2.0, IdleState.EXACT)


def test_forgetting_a_silent_router_restarts_its_replicas_bounds():
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=10)
    idle.report(report("cut", watched={"a": 600}))
    idle.report(report("other", watched={"a": 600}))
    clock.advance(20)
    idle.report(report("other", watched={"a": 620}))
    assert idle.idle_for("a")[1] == IdleState.UNKNOWN
    idle.forget_router("cut")
    assert idle.idle_for("a") == (0.0, IdleState.AT_LEAST)
    clock.advance(7)
    idle.report(report("other", watched={"a": 627}))
    assert idle.idle_for("a") == (7.0, IdleState.AT_LEAST)


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
        ({**report("r"), "incarnation": 5}, "incarnation"),
        ({**report("r"), "goodbye": "yes"}, "goodbye"),
        ({**report("r"), "route_version": "7"}, "route_version"),
    ],
)
def test_malformed_reports_are_refused_and_change_nothing(body, field):
    idle = IdleTracker(clock=Clock())
    idle.report(report("good", used={"a": 5}, watched={"a": 10}))
    before = (dict(idle.last_used_at), {k: r.to_dict() for k, r in idle.routers.items()})
    with pytest.raises(ReportError) as refused:
        idle.report(body)
    assert refused.value.field == field
    assert (dict(idle.last_used_at), {k: r.to_dict() for k, r in idle.routers.items()}) == before


def test_a_router_loaded_from_the_store_is_silent_until_it_reports():
    # A control plane that restarts, or a standby that takes over, heard nothing yet: a report
    # a second old, made to its predecessor, says nothing of what the router does now.
    from controlplane.vocabulary.idle import Router, RouterState

    clock = Clock()
    before = IdleTracker(clock=clock, live_window_s=10)
    before.report(report("r1", watched={"a": 3600}, used={"a": 3000}))
    clock.advance(1)
    after = IdleTracker(clock=clock, live_window_s=10)
    after.load(
        before.last_used_at, [Router.from_dict(r.to_dict()) for r in before.routers.values()]
    )
    assert after.routers["r1"].state(clock(), 10) is RouterState.SILENT
    assert after.idle_for("a")[1] == IdleState.UNKNOWN
    after.report(report("r1", watched={"a": 3601}, used={"a": 3001}))
    assert after.routers["r1"].state(clock(), 10) is RouterState.LIVE
    assert after.idle_for("a") == (3001.0, IdleState.EXACT)


# The engines' own load, as routers read it.


def engine_report(router, readings, incarnation="i1"):
    return {
        "router": router,
        "incarnation": incarnation,
        "uptime_s": 10.0,
        "used": {},
        "watched": {},
        "engine_load": readings,
    }


def test_the_freshest_reading_of_each_replica_among_live_routers_wins():
    clock = [1000.0]
    tracker = IdleTracker(live_window_s=10, clock=lambda: clock[0])
    tracker.report(engine_report("r1", {"a": [3, 8, 0.5, 0.05], "b": [0, 1, 0.1, 0.2]}))
    clock[0] += 1
    tracker.report(engine_report("r2", {"a": [1, 8, 0.4, 0.1]}))
    load = tracker.engine_load()
    assert load["a"] == {"waiting": 1, "running": 8, "kv_use": 0.4, "age_s": 0.1, "router": "r2"}
    assert load["b"]["router"] == "r1" and load["b"]["age_s"] == 1.2
    clock[0] += 20  # both silent: nothing is known any more
    assert tracker.engine_load() == {}


@pytest.mark.parametrize(
    "readings",
    [
        [],
        {"a": [1, 2, 0.5]},
        {"a": [-1, 2, 0.5, 0.1]},
        {"a": [1, 2, 1.5, 0.1]},
        {"a": [1, 2, float("nan"), 0.1]},
        {"a": [1, True, 0.5, 0.1]},
        {"a": [1, 2, 0.5, -0.1]},
        {"a": "busy"},
    ],
)
def test_a_bad_engine_load_map_is_refused_and_changes_nothing(readings):
    tracker = IdleTracker(live_window_s=10, clock=lambda: 1000.0)
    tracker.report(engine_report("r1", {"a": [3, 8, 0.5, 0.05]}))
    with pytest.raises(ReportError) as refused:
        tracker.report(engine_report("r1", readings))
    assert refused.value.field == "engine_load"
    assert tracker.engine_load()["a"]["waiting"] == 3

"""A router's demand for a model counts until every live router has reported after it; from
then on, their reports say who still waits. Else a demand that outlived its requests takes
the cards back from the model that just made way, and two models swap back and forth."""

from controlplane.state.fleet import Fleet
from controlplane.state.store import SqliteStore
from controlplane.vocabulary.idle import IdleTracker
from tests.controlplane.conftest import Clock, spec


def report(fleet: Fleet, router: str, waiting: dict) -> None:
    fleet.idle.report(
        {
            "router": router,
            "incarnation": "i1",
            "uptime_s": 1000,
            "route_version": 1,
            "used": {},
            "watched": {},
            "in_flight": {},
            "waiting": waiting,
        }
    )


def fleet_with_two_routers(tmp_path) -> tuple[Fleet, Clock]:
    clock = Clock(1000.0)
    fleet = Fleet(SqliteStore(tmp_path / "s.sqlite"), IdleTracker(clock=clock), clock, clock)
    fleet.apply(spec(name="a", replicas=1, min_replicas=0))
    report(fleet, "r1", {})
    report(fleet, "r2", {})
    clock.advance(0.5)
    return fleet, clock


def test_a_demand_counts_until_every_live_router_reported_after_it(tmp_path):
    fleet, clock = fleet_with_two_routers(tmp_path)
    fleet.demand("a", 1)
    assert fleet.view().wanted() == {"a": 1}, "no report counts it yet"
    clock.advance(0.5)
    report(fleet, "r2", {})  # not the router that holds the request
    assert fleet.view().wanted() == {"a": 1}, "r1 has not reported since"
    clock.advance(0.5)
    report(fleet, "r1", {})  # its request was served meanwhile
    assert fleet.view().wanted() == {}, "every router says nobody waits"


def test_a_report_that_counts_the_requests_keeps_them_wanted(tmp_path):
    fleet, clock = fleet_with_two_routers(tmp_path)
    fleet.demand("a", 1)
    clock.advance(0.5)
    report(fleet, "r1", {"a": 3})
    report(fleet, "r2", {})
    assert fleet.view().wanted() == {"a": 3}

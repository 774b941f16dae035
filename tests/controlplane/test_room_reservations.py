"""GPUs kept for a waiting model while its victims stop are kept no longer than they serve it:
given up when nobody waits any more, when room comes free elsewhere first, and when the
victims have not stopped by the room timeout (a silent router holds one)."""

from controlplane.vocabulary.model import ReplicaState
from tests.controlplane.conftest import make_node, spec
from tests.controlplane.test_reconciler import ready_all


def report(reconciler, replicas, waiting=None, router="edge"):
    return {
        "router": router,
        "incarnation": "i1",
        "uptime_s": 1000,
        "route_version": reconciler.routes.version,
        "used": {},
        "watched": {r: 1000 for r in replicas},
        "in_flight": {},
        "waiting": waiting or {},
    }


def swap_under_way(make_fleet, clock):
    """alpha holds n1's two GPUs, idle; beta waits for them: alpha retires, n1 is kept for
    beta, and a silent router still holds alpha's route, so it does not stop."""
    fleet, reconciler = make_fleet()
    reconciler.min_residency_s = 0
    reconciler.room_timeout_s = 60
    fleet.register(make_node("n1", gpus=2))
    fleet.apply(spec(name="alpha", gpus_per_replica=2, replicas=1, min_replicas=0))
    fleet.apply(spec(name="beta", gpus_per_replica=2, replicas=1, min_replicas=0))
    reconciler.tick()
    ready_all(fleet, "n1")
    reconciler.tick()
    (alpha,) = fleet.replicas
    fleet.idle.report(report(reconciler, [alpha], router="cut"))
    fleet.idle.report(report(reconciler, [alpha], {"beta": 2}))
    fleet.demand("beta", 2)
    reconciler.tick()
    assert fleet.replicas[alpha].state == ReplicaState.RETIRING and "beta" in fleet.reservations
    clock.advance(11)  # "cut" falls silent after the plan, alpha still in its table
    fleet.heartbeat("n1", {"replicas": {alpha: {"state": "Ready", "url": "http://h:1"}}})
    fleet.idle.report(report(reconciler, [], {"beta": 2}))
    fleet.demand("beta", 2)
    reconciler.tick()
    assert "silent router cut" in fleet.replicas[alpha].reason
    return fleet, reconciler, alpha


def test_the_kept_gpus_wait_for_the_victim_while_requests_wait(make_fleet, clock):
    fleet, reconciler, alpha = swap_under_way(make_fleet, clock)
    assert fleet.replicas[alpha].state == ReplicaState.RETIRING
    assert "beta" in fleet.reservations
    clock.advance(5)
    fleet.idle.report(report(reconciler, [], {"beta": 2}))
    reconciler.tick()
    assert "beta" in fleet.reservations, "within the room timeout, with requests waiting"


def test_gpus_are_given_up_when_nobody_waits_any_more(make_fleet, clock):
    fleet, reconciler, alpha = swap_under_way(make_fleet, clock)
    clock.advance(11)  # the demand is older than a router's lease
    fleet.idle.report(report(reconciler, [], {}))
    reconciler.tick()
    assert "beta" not in fleet.reservations
    assert any("no request waits for it any more" in e for _, e in fleet.events["beta"])


def test_gpus_are_given_up_when_the_victims_do_not_stop_in_time(make_fleet, clock):
    fleet, reconciler, alpha = swap_under_way(make_fleet, clock)
    for _ in range(7):
        clock.advance(10)
        fleet.heartbeat("n1", {"replicas": {alpha: {"state": "Ready", "url": "http://h:1"}}})
        fleet.idle.report(report(reconciler, [], {"beta": 2}))
        reconciler.tick()
    assert "beta" not in fleet.reservations
    assert any("did not stop within 1m" in e for _, e in fleet.events["beta"])
    assert fleet.replicas[alpha].state == ReplicaState.RETIRING, "the silent router still holds it"


def test_gpus_are_given_up_when_room_comes_free_elsewhere_first(make_fleet, clock):
    fleet, reconciler, alpha = swap_under_way(make_fleet, clock)
    fleet.register(make_node("n2", gpus=2))
    fleet.idle.report(report(reconciler, [], {"beta": 2}))
    reconciler.tick()
    assert "beta" not in fleet.reservations
    (beta,) = [r for r in fleet.replicas.values() if r.model == "beta"]
    assert beta.nodes == ["n2"], "placed where room came free, not on the victim's cards"
    assert any("room came free elsewhere first" in e for _, e in fleet.events["beta"])


def test_a_restart_keeps_the_gpus_kept_and_the_demand(make_fleet, clock):
    """Reservations are records: a restarted (or new) leader does not hand the victims' GPUs
    to anyone else, and knows how long the requests have waited."""
    fleet, reconciler, alpha = swap_under_way(make_fleet, clock)
    kept = fleet.reservations["beta"]
    since, woken = fleet.demand_since["beta"], fleet.woken_at["beta"]
    fleet.swap_totals["alpha"] = 3
    fleet.flush_records()
    again, reconciler = make_fleet()
    assert again.reservations["beta"] == kept
    assert again.reserved_gpus() == {("n1", 0): "beta", ("n1", 1): "beta"}
    assert (again.demand_since["beta"], again.woken_at["beta"]) == (since, woken)
    assert again.swap_totals == {"alpha": 3}
    # What went is gone from the store too.
    del again.reservations["beta"]
    again.flush_records()
    assert "beta" not in make_fleet()[0].reservations


def test_a_deleted_models_records_go_with_it(make_fleet, clock):
    fleet, reconciler, alpha = swap_under_way(make_fleet, clock)
    fleet.swap_totals["beta"] = 2
    fleet.delete("beta")
    reconciler.tick()
    again, _ = make_fleet()
    assert "beta" not in again.reservations and "beta" not in again.woken_at
    assert "beta" not in again.demand_since and "beta" not in again.swap_totals

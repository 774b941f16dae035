"""Every stop the fleet decides goes through the one safe stop: a Ready replica's route is
withdrawn, and it stops only once every live router has dropped it and has nothing in flight
on it. Scaling down, a re-apply, a drain and a replacement included."""

from controlplane.vocabulary.model import ReplicaState, Schedulable
from tests.controlplane.conftest import make_node, spec
from tests.controlplane.test_reconciler import ready_all


def report(reconciler, replicas, in_flight=None):
    return {
        "router": "edge",
        "incarnation": "i1",
        "uptime_s": 1000,
        "route_version": reconciler.routes.version,
        "used": {r: 0 for r in replicas},
        "watched": {r: 1000 for r in replicas},
        "in_flight": in_flight or {},
    }


def serving(make_fleet, replicas=3, **kw):
    """A model whose replicas are Ready, in the routes, each with a stream on one router."""
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1"))
    fleet.apply(spec(replicas=replicas, **kw))
    reconciler.tick()
    ready_all(fleet, "n1")
    reconciler.tick()
    ids = sorted(fleet.replicas)
    fleet.idle.report(report(reconciler, ids, {r: 1 for r in ids}))
    return fleet, reconciler, ids


def states(fleet):
    return sorted(str(r.state) for r in fleet.replicas.values())


def test_scaling_down_withdraws_the_routes_and_waits_for_the_streams(make_fleet):
    fleet, reconciler, ids = serving(make_fleet)
    fleet.scale("llama", 1)
    reconciler.tick()
    assert states(fleet) == ["Ready", "Retiring", "Retiring"], "not stopped under its streams"
    (kept,) = [r.id for r in fleet.replicas.values() if r.state == ReplicaState.READY]
    assert [e["id"] for e in reconciler.routes.routes["llama"]] == [kept]
    retiring = [r for r in fleet.replicas.values() if r.state == ReplicaState.RETIRING]
    assert all(r.reason.startswith("scaled down to 1; route withdrawn") for r in retiring)
    fleet.idle.report(report(reconciler, [kept], {r: 1 for r in ids}))
    reconciler.tick()
    assert states(fleet) == ["Ready", "Retiring", "Retiring"], "a stream is still on each"
    assert all("request(s) on it" in r.reason for r in retiring)
    fleet.idle.report(report(reconciler, [kept], {kept: 1}))
    reconciler.tick()
    assert states(fleet) == ["Ready", "Stopping", "Stopping"]
    assert all(r.reason == "scaled down to 1: no router holds it" for r in retiring)


def test_scaling_back_up_before_they_stopped_brings_them_back(make_fleet):
    fleet, reconciler, ids = serving(make_fleet)
    fleet.scale("llama", 1)
    reconciler.tick()
    fleet.scale("llama", 3)
    reconciler.tick()
    assert states(fleet) == ["Ready", "Ready", "Ready"], "no cold start while they still run"
    assert sorted(fleet.replicas) == ids


def test_re_applying_an_autoscaled_model_keeps_what_its_load_asked_for(make_fleet, clock):
    bounds = {"min_replicas": 1, "max_replicas": 4, "target_in_flight": 4}
    fleet, reconciler, ids = serving(make_fleet, replicas=1, **bounds)
    fleet.set_scaled("llama", 4)  # 16 in flight took it to 4
    reconciler.tick()
    ready_all(fleet, "n1")
    reconciler.tick()
    ids = sorted(fleet.replicas)
    assert len(ids) == 4
    fleet.idle.report(report(reconciler, ids, {r: 4 for r in ids}))
    outcome = fleet.apply(spec(replicas=1, scale_down_delay="2m", **bounds))[1]
    assert outcome == "configured"
    reconciler.tick()
    assert states(fleet) == ["Ready"] * 4 and sorted(fleet.replicas) == ids
    assert fleet.desired(fleet.specs["llama"]) == 4
    # New bounds still hold: a lower ceiling goes through the safe stop.
    fleet.apply(spec(replicas=1, scale_down_delay="2m", **{**bounds, "max_replicas": 2}))
    reconciler.tick()
    assert states(fleet) == ["Ready", "Ready", "Retiring", "Retiring"]


def test_a_drained_nodes_replica_stops_only_once_its_router_lets_go(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=1))
    fleet.apply(spec(replicas=1))
    reconciler.tick()
    ready_all(fleet, "n1")
    reconciler.tick()
    (old,) = fleet.replicas
    fleet.idle.report(report(reconciler, [old], {old: 1}))
    fleet.register(make_node("n2", gpus=1))
    fleet.set_schedulable("n1", Schedulable.DRAINING)
    reconciler.tick()
    ready_all(fleet, "n2")
    reconciler.tick()
    assert fleet.replicas[old].state == ReplicaState.RETIRING
    assert fleet.replicas[old].reason.startswith("node draining; route withdrawn")
    new = next(r for r in fleet.replicas if r != old)
    fleet.idle.report(report(reconciler, [new]))
    reconciler.tick()
    assert fleet.replicas[old].state == ReplicaState.STOPPING


def test_deleting_a_model_lets_its_streams_end_before_its_replicas_stop(make_fleet):
    fleet, reconciler, ids = serving(make_fleet)
    fleet.delete("llama")
    reconciler.tick()
    assert states(fleet) == ["Retiring"] * 3, "not cut under its streams"
    assert reconciler.routes.routes == {}, "its routes are gone at once"
    fleet.idle.report(report(reconciler, [], {ids[0]: 1}))
    reconciler.tick()
    assert states(fleet) == ["Retiring", "Stopping", "Stopping"]
    fleet.idle.report(report(reconciler, []))
    reconciler.tick()
    assert states(fleet) == ["Stopping"] * 3

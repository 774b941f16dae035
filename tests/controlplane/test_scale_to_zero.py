"""Scale to zero in the control plane, with an injected clock: which replicas stop, the safe
stop (route first, then only once no router holds it), and waking on demand."""

import pytest

from controlplane.rules.scaling import stop_idle
from controlplane.state.fleet import BadRequest
from controlplane.vocabulary.model import ReplicaState
from tests.controlplane.conftest import make_node, spec
from tests.controlplane.test_reconciler import ready_all

NEWEST = 2**62  # a router that holds the newest table: every withdrawal so far acknowledged


def report(replicas, used=None, router="edge", incarnation="i1", in_flight=None, version=NEWEST):
    return {
        "router": router,
        "incarnation": incarnation,
        "uptime_s": 1000,
        "route_version": version,
        "used": used or {},
        "watched": {r: 1000 for r in replicas},
        "in_flight": in_flight or {},
    }


def advance(fleet, clock, seconds):
    """Time passes, and the node's agent keeps heartbeating."""
    clock.advance(seconds)
    for node in fleet.nodes:
        ready_all(fleet, node)


@pytest.fixture
def sleepy(make_fleet, clock):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=2))
    fleet.apply(spec(name="m", replicas=2, min_replicas=0, scale_to_zero_after="20s"))
    reconciler.tick()
    ready_all(fleet, "n1")
    reconciler.tick()
    return fleet, reconciler, clock


def test_idle_replicas_retire_then_stop_once_routers_let_go(sleepy):
    fleet, reconciler, clock = sleepy
    a, b = sorted(fleet.replicas)
    fleet.idle.report(report([a, b], used={a: 0}))
    advance(fleet, clock, 15)
    fleet.idle.report(report([a, b], used={a: 15}))  # b never used: at least 1000 s
    reconciler.tick()
    assert fleet.replicas[b].state == ReplicaState.RETIRING, "the longest idle goes first"
    assert fleet.replicas[a].state == ReplicaState.READY, "used 15 s ago: under 20 s"
    assert [e["id"] for e in reconciler.routes.routes["m"]] == [a], "its route is withdrawn"
    reconciler.tick()
    assert fleet.replicas[b].state == ReplicaState.RETIRING
    assert "router edge has not dropped its route yet" in fleet.replicas[b].reason
    fleet.idle.report(report([a], in_flight={b: 1}))  # dropped it, but a stream is still on it
    reconciler.tick()
    assert "1 request(s) on it" in fleet.replicas[b].reason
    fleet.idle.report(report([a], version=reconciler.routes.version - 1))
    reconciler.tick()
    assert "router edge has not acknowledged route version" in fleet.replicas[b].reason, (
        "its table may be older than the withdrawal: a newer one may have the route"
    )
    fleet.idle.report(report([a]))
    reconciler.tick()
    assert fleet.replicas[b].state == ReplicaState.STOPPING
    advance(fleet, clock, 10)
    fleet.idle.report(report([a]))
    reconciler.tick()
    assert fleet.replicas[a].state == ReplicaState.RETIRING
    assert fleet.desired(fleet.specs["m"]) == 0


def test_unknown_use_is_never_stopped(sleepy):
    fleet, reconciler, clock = sleepy
    advance(fleet, clock, 3600)  # no router ever reported: unknown
    reconciler.tick()
    assert {r.state for r in fleet.replicas.values()} == {ReplicaState.READY}
    fleet.idle.report(report(list(fleet.replicas), router="cut"))
    advance(
        fleet, clock, 3600
    )  # "cut" is silent now: its replicas are unknown, whatever the others say
    fleet.idle.report(report(list(fleet.replicas), router="other"))
    reconciler.tick()
    assert {r.state for r in fleet.replicas.values()} == {ReplicaState.READY}
    dry = stop_idle(fleet, reconciler.executor, [], None, dry_run=True)
    assert dry["stopped"] == []
    assert {r["why"] for r in dry["refused"]} == {"use unknown: silent router cut may be using it"}


def test_a_silent_router_blocks_a_stop_already_under_way(sleepy):
    fleet, reconciler, clock = sleepy
    a, b = sorted(fleet.replicas)
    fleet.idle.report(report([a, b], router="cut"))
    fleet.idle.report(report([a, b], router="other"))
    advance(fleet, clock, 5)
    fleet.idle.report(report([a, b], router="cut"))
    fleet.idle.report(report([a, b], router="other"))
    stop_idle(fleet, reconciler.executor, [], 1.0, dry_run=False)
    assert {r.state for r in fleet.replicas.values()} == {ReplicaState.RETIRING}
    advance(fleet, clock, 11)  # "cut" stops reporting: silent, with both in its last table
    fleet.idle.report(report([], router="other"))
    reconciler.tick()
    assert all("silent router cut" in r.reason for r in fleet.replicas.values())
    assert {r.state for r in fleet.replicas.values()} == {ReplicaState.RETIRING}


def test_demand_wakes_a_model_at_zero_a_retiring_replica_first(sleepy):
    fleet, reconciler, clock = sleepy
    a, b = sorted(fleet.replicas)
    # nobody reported: unknown, nothing stops
    stop_idle(fleet, reconciler.executor, [], 1.0, dry_run=False)
    assert fleet.desired(fleet.specs["m"]) == 2
    fleet.idle.report(report([a, b]))
    advance(fleet, clock, 30)
    fleet.idle.report(report([a, b]))
    reconciler.tick()
    assert {r.state for r in fleet.replicas.values()} == {ReplicaState.RETIRING}
    fleet.demand("m", 3)  # a request arrives while they retire
    reconciler.tick()
    states = sorted(str(r.state) for r in fleet.replicas.values())
    assert states == ["Ready", "Retiring"], "one serves again at once"
    assert fleet.desired(fleet.specs["m"]) == 1
    fleet.idle.report(report([]))
    reconciler.tick()
    assert sorted(str(r.state) for r in fleet.replicas.values()) == ["Ready", "Stopping"]


def test_demand_for_a_model_at_zero_places_one_and_says_when_it_cannot(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=1))
    fleet.apply(spec(name="small", min_replicas=0, scale_to_zero_after="1m"))
    fleet.apply(spec(name="big", gpus_per_replica=4, min_replicas=0, scale_to_zero_after="1m"))
    fleet.set_scaled("small", 0)
    fleet.set_scaled("big", 0)
    reconciler.tick()
    assert fleet.replicas == {}
    fleet.demand("small", 1)
    fleet.demand("big", 1)
    reconciler.tick()
    assert [r.model for r in fleet.replicas.values()] == ["small"]
    assert "needs 4 free H100-80GB GPUs" in fleet.reasons["big"]


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"replicas": 1, "min_replicas": 2}, "min_replicas"),
        ({"min_replicas": -1}, "min_replicas"),
        ({"scale_to_zero_after": "soon"}, "scale_to_zero_after"),
        ({"scale_to_zero_after": -5}, "scale_to_zero_after"),
    ],
)
def test_bad_scale_fields_are_refused_by_name_and_nothing_is_stored(make_fleet, fields, field):
    fleet, _ = make_fleet()
    with pytest.raises(BadRequest) as refused:
        fleet.apply(spec(name="m", **fields))
    assert refused.value.field == field and fleet.specs == {}


def test_a_spec_affinity_of_yaml_off_is_off_and_nonsense_is_refused(make_fleet):
    fleet, _ = make_fleet()
    spec_out, _ = fleet.apply(spec(name="m", affinity=False))  # `affinity: off` in YAML
    assert spec_out.affinity == "off"
    with pytest.raises(BadRequest) as refused:
        fleet.apply(spec(name="n", affinity="sticky"))
    assert refused.value.field == "affinity"

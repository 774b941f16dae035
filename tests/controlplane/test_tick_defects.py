"""Where two decisions of a tick meet: each case a user hit, kept as a test that failed on the
tick before it was taken apart into steps and one executor."""

import time

from controlplane.vocabulary.model import ReplicaState, Schedulable
from tests.controlplane.conftest import make_node, spec
from tests.controlplane.test_reconciler import ready_all
from tests.controlplane.test_safe_stop import report, serving, states


def unhealthy(fleet, node, replica_id):
    """The agent says the engine's probe fails: the replica keeps its streams meanwhile."""
    reports = {
        a["replica"]: {"state": "Ready", "url": f"http://127.0.0.1:{9000 + i}"}
        for i, a in enumerate(fleet.assignments(node))
    }
    reports[replica_id] = {"state": "Unhealthy", "url": reports[replica_id]["url"]}
    fleet.heartbeat(node, {"replicas": reports})


def test_an_unhealthy_replica_with_streams_is_withdrawn_not_stopped_on_scale_down(make_fleet):
    fleet, reconciler, ids = serving(make_fleet, replicas=2)
    sick = ids[0]
    unhealthy(fleet, "n1", sick)
    reconciler.tick()  # its route goes: it is no longer Ready
    fleet.idle.report(report(reconciler, ids, {sick: 2}))
    fleet.scale("llama", 1)
    reconciler.tick()
    assert fleet.replicas[sick].state == ReplicaState.RETIRING, fleet.replicas[sick].reason
    others = [r for r in ids if r != sick]
    fleet.idle.report(report(reconciler, others, {sick: 2}))  # a table without it, acked
    reconciler.tick()
    assert fleet.replicas[sick].state == ReplicaState.RETIRING
    assert "router edge has 2 request(s) on it" in fleet.replicas[sick].reason
    assert any(a["replica"] == sick for a in fleet.assignments("n1")), "its engine keeps running"
    fleet.idle.report(report(reconciler, ids[1:]))  # its streams ended
    reconciler.tick()
    assert fleet.replicas[sick].state == ReplicaState.STOPPING


def test_deleting_a_model_waits_for_the_streams_of_its_unhealthy_replica(make_fleet):
    fleet, reconciler, ids = serving(make_fleet, replicas=1)
    unhealthy(fleet, "n1", ids[0])
    reconciler.tick()
    fleet.idle.report(report(reconciler, ids, {ids[0]: 1}))
    fleet.delete("llama")
    reconciler.tick()
    assert states(fleet) == ["Retiring"]


def test_draining_a_node_waits_for_the_streams_of_its_unhealthy_replica(make_fleet):
    fleet, reconciler, ids = serving(make_fleet, replicas=1)
    fleet.register(make_node("n2"))
    unhealthy(fleet, "n1", ids[0])
    reconciler.tick()
    fleet.idle.report(report(reconciler, ids, {ids[0]: 1}))
    fleet.set_schedulable("n1", Schedulable.DRAINING)
    reconciler.tick()  # its replacement goes to n2
    ready_all(fleet, "n2")
    reconciler.tick()
    assert fleet.replicas[ids[0]].state == ReplicaState.RETIRING


def partitioned(make_fleet, clock, replicas=1):
    """n1 serves the model, n2 is spare; n1 falls silent past the node timeout."""
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=1))
    fleet.apply(spec(replicas=replicas))
    reconciler.tick()
    ready_all(fleet, "n1")
    reconciler.tick()
    (lost,) = fleet.replicas
    fleet.register(make_node("n2", gpus=1))
    clock.advance(10)
    fleet.heartbeat("n2", {"replicas": {}})
    clock.advance(10)
    reconciler.tick()
    assert fleet.replicas[lost].state == ReplicaState.FAILED
    return fleet, reconciler, lost


def back(fleet, lost):
    """n1 heartbeats again: its agent still runs the lost replica. Returns n1's assignments."""
    reports = {lost: {"state": "Ready", "url": "http://127.0.0.1:9000"}}
    return [a["replica"] for a in fleet.heartbeat("n1", {"replicas": reports})]


def test_a_node_back_from_a_partition_lets_its_replicas_streams_finish(make_fleet, clock):
    """Replaced meanwhile, the lost replica makes way for its replacement: through the safe
    stop, never stopped on the spot while a router streams from it."""
    fleet, reconciler, lost = partitioned(make_fleet, clock)
    (replacement,) = [r for r in fleet.replicas if r != lost]
    ready_all(fleet, "n2")
    reconciler.tick()
    fleet.idle.report(report(reconciler, [replacement], {lost: 1}))
    assert back(fleet, lost) == [lost], "not stopped on the spot"
    reconciler.tick()
    assert fleet.replicas[replacement].state == ReplicaState.READY
    assert fleet.replicas[lost].state == ReplicaState.RETIRING, fleet.replicas[lost].reason
    assert back(fleet, lost) == [lost], "its engine keeps running while it streams"
    fleet.idle.report(report(reconciler, [replacement]))
    reconciler.tick()
    assert fleet.replicas[lost].state == ReplicaState.STOPPING
    assert fleet.assignments("n1") == []


def test_a_node_back_after_its_model_was_deleted_lets_the_streams_finish(make_fleet, clock):
    fleet, reconciler, lost = partitioned(make_fleet, clock)
    fleet.delete("llama")
    reconciler.tick()
    fleet.idle.report(report(reconciler, [], {lost: 1}))
    assert back(fleet, lost) == [lost]
    reconciler.tick()
    assert fleet.replicas[lost].state == ReplicaState.RETIRING, fleet.replicas[lost].reason
    assert back(fleet, lost) == [lost], "its engine keeps running while it streams"
    fleet.idle.report(report(reconciler, []))
    reconciler.tick()
    assert fleet.replicas[lost].state == ReplicaState.STOPPING
    assert fleet.assignments("n1") == []


def test_a_node_back_before_its_replacement_started_keeps_its_replica(make_fleet, clock):
    """Its model still wants it: the replacement, never routed, is the one that stops."""
    fleet, reconciler, lost = partitioned(make_fleet, clock)
    (replacement,) = [r for r in fleet.replicas if r != lost]
    fleet.heartbeat("n1", {"replicas": {lost: {"state": "Ready", "url": "http://127.0.0.1:9000"}}})
    reconciler.tick()
    assert fleet.replicas[lost].state == ReplicaState.READY
    assert fleet.replicas[replacement].state == ReplicaState.STOPPING
    assert [e["id"] for e in reconciler.routes.routes["llama"]] == [lost]


def test_scale_to_the_spec_count_starts_a_model_that_idleness_scaled_to_zero(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1"))
    fleet.apply(spec(replicas=2, min_replicas=0, scale_to_zero_after="1m"))
    fleet.set_scaled("llama", 0)  # idleness took it to zero
    reconciler.tick()
    assert fleet.replicas == {}
    fleet.scale("llama", 2)
    assert fleet.desired(fleet.specs["llama"]) == 2
    reconciler.tick()
    assert len(fleet.replicas) == 2


class CountingDict(dict):
    """A replica table that counts how often it is walked whole."""

    walks = 0

    def values(self):
        CountingDict.walks += 1
        return super().values()


def test_demand_and_the_idle_plan_look_at_their_models_replicas_only(make_fleet):
    from controlplane.rules.scaling import plan_stop_idle

    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1"))
    for name in ("a", "b", "c"):
        fleet.apply(spec(name=name, replicas=2))
    reconciler.tick()
    fleet.replicas = CountingDict(fleet.replicas)
    CountingDict.walks = 0
    fleet.demand("a", 1)
    plan_stop_idle(fleet.view(), [], 60.0)
    assert CountingDict.walks == 0


def test_a_step_reads_a_view_built_without_a_fleet():
    from controlplane.rules.view import FleetView
    from controlplane.state.fleet import parse_node
    from controlplane.tick.steps.models import models
    from controlplane.vocabulary.actions import Place
    from controlplane.vocabulary.idle import IdleTracker
    from controlplane.vocabulary.specs import validate_spec

    node = parse_node(make_node("n1", gpus=2))
    node.last_heartbeat = time.monotonic()
    view = FleetView(
        nodes={"n1": node},
        replicas={},
        specs={"m": validate_spec(spec(name="m", replicas=2))},
        idle=IdleTracker(),
        now=time.time(),
    )
    actions = models(view)
    assert [type(a) for a in actions].count(Place) == 2
    assert view.replicas == {}, "a step changes nothing"


def test_a_replica_back_with_its_node_that_then_dies_stays_dead(make_fleet, clock):
    """Its engine exits after the node came back: a later Ready report of the node does not
    bring a dead replica back as if it were lost with the node."""
    fleet, reconciler, lost = partitioned(make_fleet, clock)
    back(fleet, lost)
    fleet.heartbeat("n1", {"replicas": {lost: {"state": "Failed", "exit_code": -9}}})
    assert fleet.replicas[lost].state == ReplicaState.FAILED
    back(fleet, lost)
    assert fleet.replicas[lost].state == ReplicaState.FAILED

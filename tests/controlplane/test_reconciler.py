from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import ReplicaState, Schedulable
from tests.controlplane.conftest import make_node, spec


def ready_all(fleet, node_name, url_base="http://127.0.0.1:"):
    reports = {}
    for i, a in enumerate(fleet.assignments(node_name)):
        reports[a["replica"]] = {"state": "Ready", "url": f"{url_base}{9000 + i}"}
    fleet.heartbeat(node_name, {"replicas": reports})


def test_places_starts_and_publishes_ready_replicas(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=4))
    fleet.apply(spec(replicas=2, gpus_per_replica=2))
    version = reconciler.routes.version
    reconciler.tick()
    assert len(fleet.assignments("n1")) == 2
    assert reconciler.routes.routes == {"llama": []}
    ready_all(fleet, "n1")
    reconciler.tick()
    assert len(reconciler.routes.routes["llama"]) == 2
    assert reconciler.routes.version > version


def test_scale_down_stops_the_least_useful_and_agents_confirm(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1"))
    fleet.apply(spec(replicas=3))
    reconciler.tick()
    ready_all(fleet, "n1")
    fleet.scale("llama", 1)
    reconciler.tick()
    states = sorted(str(r.state) for r in fleet.replicas.values())
    assert states == ["Ready", "Stopping", "Stopping"]
    assert len(fleet.assignments("n1")) == 1
    running = {
        a["replica"]: {"state": "Ready", "url": "http://127.0.0.1:9000"}
        for a in fleet.assignments("n1")
    }
    fleet.heartbeat("n1", {"replicas": running})
    assert len(fleet.replicas) == 1


def test_missed_heartbeats_make_a_node_not_ready_and_replicas_move(make_fleet, clock):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=1))
    fleet.register(make_node("n2", gpus=1))
    fleet.apply(spec(replicas=1))
    reconciler.tick()
    (first,) = fleet.replicas.values()
    lost_node = first.nodes[0]
    other = "n2" if lost_node == "n1" else "n1"
    clock.advance(10)
    fleet.heartbeat(other, {"replicas": {}})
    clock.advance(10)
    reconciler.tick()
    assert not fleet.nodes[lost_node].ready
    assert first.state == ReplicaState.FAILED and "NotReady" in first.reason
    live = [r for r in fleet.replicas.values() if r.state == ReplicaState.PENDING]
    assert [r.nodes for r in live] == [[other]]


def test_unplaceable_model_has_a_reason_and_placement_follows_capacity(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=2))
    fleet.apply(spec(gpus_per_replica=4))
    reconciler.tick()
    assert "needs 4 free H100-80GB GPUs on one node" in fleet.reasons["llama"]
    fleet.register(make_node("n2", gpus=8))
    reconciler.tick()
    assert "llama" not in fleet.reasons and len(fleet.replicas) == 1


def test_drain_moves_replicas_before_stopping_them(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=1))
    fleet.register(make_node("n2", gpus=1))
    fleet.apply(spec(replicas=1))
    reconciler.tick()
    (old,) = fleet.replicas.values()
    ready_all(fleet, old.nodes[0])
    fleet.set_schedulable(old.nodes[0], Schedulable.DRAINING)
    reconciler.tick()
    assert old.state == ReplicaState.READY, "kept until its replacement is ready"
    (new,) = [r for r in fleet.replicas.values() if r.id != old.id]
    ready_all(fleet, new.nodes[0])
    reconciler.tick()
    assert old.state == ReplicaState.STOPPING


def test_deleting_a_model_stops_its_replicas(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1"))
    fleet.apply(spec(replicas=2))
    reconciler.tick()
    fleet.delete("llama")
    reconciler.tick()
    assert {str(r.state) for r in fleet.replicas.values()} == {"Stopping"}
    assert fleet.assignments("n1") == []
    assert reconciler.routes.routes == {}


def test_a_used_replica_stays_known_after_a_control_plane_restart(make_fleet, clock):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1"))
    fleet.apply(spec())
    reconciler.tick()
    (replica,) = fleet.replicas
    used = {"router": "r1", "uptime_s": 50, "used": {replica: 4}, "watched": {replica: 50}}
    fleet.idle.report(used)
    fleet.idle.report({**used, "goodbye": True})  # redeployed cleanly
    reconciler.tick()  # flushes last_used_at and the routers
    clock.advance(100)
    restarted, _ = make_fleet()
    assert restarted.idle.states() == {"r1": "gone"}
    restarted.idle.report(
        {"router": "r1", "incarnation": "i2", "uptime_s": 1, "used": {}, "watched": {replica: 1}}
    )
    assert restarted.idle.idle_for(replica) == (104.0, IdleState.EXACT)
    assert set(restarted.replicas) == {replica}
    assert restarted.specs["llama"].replicas == 1


def test_failed_replica_is_replaced_and_kept_for_display(make_fleet, clock):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=2))
    fleet.apply(spec())
    reconciler.tick()
    (replica,) = fleet.replicas
    fleet.heartbeat(
        "n1",
        {
            "replicas": {
                replica: {"state": "Failed", "exit_code": 1, "log_tail": "CUDA out of memory"}
            }
        },
    )
    reconciler.tick()
    assert fleet.replicas[replica].state == ReplicaState.FAILED
    assert fleet.replicas[replica].log_tail == "CUDA out of memory"
    assert len([r for r in fleet.replicas.values() if r.state == ReplicaState.PENDING]) == 1
    clock.advance(601)
    reconciler.tick()
    assert replica not in fleet.replicas


def test_a_multi_node_replica_gets_ranks_and_one_leader(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register({**make_node("a1", fabric="nvl-1"), "address": "10.0.0.1"})
    fleet.register({**make_node("a2", fabric="nvl-1"), "address": "10.0.0.2"})
    fleet.register({**make_node("b1", fabric="nvl-2"), "address": "10.0.0.3"})
    fleet.apply(spec(gpus_per_replica=8, nodes_per_replica=2))
    reconciler.tick()
    (replica,) = fleet.replicas.values()
    assert replica.nodes == ["a1", "a2"]
    leader, follower = fleet.assignments("a1")[0], fleet.assignments("a2")[0]
    assert (leader["rank"], follower["rank"]) == (0, 1)
    assert leader["nnodes"] == follower["nnodes"] == 2
    assert leader["master_addr"] == follower["master_addr"] == "10.0.0.1"
    assert fleet.assignments("b1") == []
    fleet.heartbeat("a2", {"replicas": {replica.id: {"state": "Ready", "url": ""}}})
    reconciler.tick()
    assert reconciler.routes.routes == {"llama": []}, "only the leader's report makes it Ready"
    fleet.heartbeat(
        "a1", {"replicas": {replica.id: {"state": "Ready", "url": "http://10.0.0.1:9000"}}}
    )
    reconciler.tick()
    assert reconciler.routes.routes["llama"] == [{"id": replica.id, "url": "http://10.0.0.1:9000"}]
    fleet.heartbeat("a2", {"replicas": {replica.id: {"state": "Failed", "exit_code": 1}}})
    reconciler.tick()
    assert fleet.replicas[replica.id].state == ReplicaState.FAILED, "a follower's death fails it"
    assert reconciler.routes.routes == {"llama": []}


def test_a_replica_on_a_failed_gpu_is_degraded_then_replaced(make_fleet):
    from controlplane.views.summary import replica_rows, summary

    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=2))
    fleet.register(make_node("n2", gpus=2))
    fleet.apply(spec(replicas=1, gpus_per_replica=2))
    reconciler.tick()
    (old,) = fleet.replicas.values()
    ready_all(fleet, old.nodes[0])
    bad = old.placement[0].gpus[1]
    gpus = [{"index": i, "healthy": i != bad, "reason": "XID 79"} for i in range(2)]
    fleet.heartbeat(old.nodes[0], {"gpus": gpus, "replicas": {old.id: {"state": "Ready"}}})
    reconciler.tick()
    row = next(r for r in replica_rows(fleet.snapshot()) if r["id"] == old.id)
    assert row["state"] == "Degraded" and row["gpus"] == 2 and row["gpus_unhealthy"] == 1
    assert row["reason"] == f"GPU {bad} on {old.nodes[0]} unhealthy: XID 79"
    numbers = summary(fleet.snapshot())
    h100 = numbers["capacity"]["H100-80GB"]
    # Its healthy card and the two its replacement holds are used, the failed one is not.
    assert (h100["used"], h100["unhealthy"], h100["free"]) == (3, 1, 0), "each card once"
    assert numbers["degraded_replicas"][0]["id"] == old.id
    assert old.state == ReplicaState.READY, "it serves until its replacement is ready"
    assert [e["id"] for e in reconciler.routes.routes["llama"]] == [old.id]
    (new,) = [r for r in fleet.replicas.values() if r.id != old.id]
    assert new.nodes != old.nodes
    ready_all(fleet, new.nodes[0])
    reconciler.tick()
    assert old.state == ReplicaState.STOPPING and "XID 79" in old.reason

"""Sleeping engines, tick by tick: idle replicas sleep through the safe stop, requests wake
them, a swap puts the card's awake occupant to sleep, memory is counted, and what may not
sleep (unknown use, no host memory) stays awake."""

import pytest

from controlplane.state.fleet import BadRequest
from controlplane.views.summary import replica_rows
from controlplane.vocabulary.model import ReplicaState
from tests.controlplane.conftest import ReportingRouter, make_node, spec

HOST_MB = 2 * 1024 * 1024  # 2 TiB, as an 8-GPU node has


def node(name="n1", gpus=1, host_mb=HOST_MB):
    return {**make_node(name, gpus=gpus), "host_memory_mb": host_mb}


def sleepy(name, **kw):
    body = {
        "engine": "vllm",
        "sleep": {"level": 1, "after": "60s", "wake_timeout": "30s"},
        "replicas": 1,
        "min_replicas": 0,
        "min_residency": "0s",
    }
    return spec(name=name, **{**body, **kw})


def agent_says(fleet, node_name, state_of):
    """The node's agent reports each assigned replica in the state `state_of(assignment)`."""
    reports = {}
    for i, a in enumerate(fleet.assignments(node_name)):
        reports[a["replica"]] = {"state": state_of(a), "url": f"http://127.0.0.1:{9000 + i}"}
    fleet.heartbeat(node_name, {"replicas": reports})


def obeying_agent(fleet, node_name):
    """An agent whose engines do what they are told at once."""
    agent_says(fleet, node_name, lambda a: "Asleep" if a["sleep"] else "Ready")


def wait(fleet, clock, seconds):
    """Time passes; the node's agent keeps heartbeating meanwhile."""
    clock.advance(seconds)
    for name in fleet.nodes:
        fleet.heartbeat(name, {})


def one_replica(fleet, model):
    (replica,) = fleet.replicas_of(model)
    return replica


def asleep_alpha(make_fleet, clock, host_mb=HOST_MB, **spec_fields):
    """alpha served, then unused past its sleep.after: on its way to sleep, if it may."""
    fleet, reconciler = make_fleet()
    router = ReportingRouter(fleet, reconciler)
    fleet.register(node(host_mb=host_mb))
    fleet.apply(sleepy("alpha", **spec_fields))
    reconciler.tick()
    obeying_agent(fleet, "n1")
    reconciler.tick()
    router.report()
    wait(fleet, clock, 61)
    router.report()
    reconciler.tick()
    return fleet, reconciler, router


def test_an_idle_replica_sleeps_through_the_safe_stop(make_fleet, clock):
    fleet, reconciler, router = asleep_alpha(make_fleet, clock)
    alpha = one_replica(fleet, "alpha")
    assert alpha.state == ReplicaState.SLEEPING and alpha.sleep == 0
    assert reconciler.routes.routes["alpha"] == [], "its route goes first"
    reconciler.tick()
    assert alpha.sleep == 0, "the router has not dropped its route yet"
    assert "router edge has not dropped its route" in alpha.reason
    router.report()  # its table without alpha
    reconciler.tick()
    assert alpha.sleep == 1 and "engine told to sleep (level 1)" in alpha.reason
    assert fleet.assignments("n1")[0]["sleep"] == 1
    obeying_agent(fleet, "n1")
    assert alpha.state == ReplicaState.ASLEEP
    assert fleet.held_gpus() == set(), "a sleeper leaves its card to an awake replica"
    assert fleet.sleepers().reserve[("n1", 0)] == 1024
    assert fleet.sleep_totals == {"alpha": 1}
    assert fleet.desired(fleet.specs["alpha"]) == 1, "a sleeper is still one of its replicas"


def put_to_sleep(fleet, reconciler, router):
    router.report()
    reconciler.tick()
    obeying_agent(fleet, "n1")
    reconciler.tick()


def test_a_request_wakes_a_sleeper_and_the_route_comes_back(make_fleet, clock):
    fleet, reconciler, router = asleep_alpha(make_fleet, clock)
    put_to_sleep(fleet, reconciler, router)
    alpha = one_replica(fleet, "alpha")
    assert alpha.state == ReplicaState.ASLEEP
    router.report(waiting={"alpha": 2})
    reconciler.tick()
    assert alpha.state == ReplicaState.WAKING and alpha.sleep == 0
    assert fleet.assignments("n1")[0]["sleep"] == 0
    wait(fleet, clock, 1.5)
    obeying_agent(fleet, "n1")
    assert alpha.state == ReplicaState.READY and "woken in 1.5s" in alpha.reason
    reconciler.tick()
    assert [r["id"] for r in reconciler.routes.routes["alpha"]] == [alpha.id]
    assert fleet.wake_totals == {"alpha": 1} and fleet.wake_seconds.sum == pytest.approx(1.5)


def test_a_swap_puts_the_cards_awake_occupant_to_sleep_and_wakes_the_sleeper(make_fleet, clock):
    fleet, reconciler, router = asleep_alpha(make_fleet, clock)
    put_to_sleep(fleet, reconciler, router)
    fleet.apply(sleepy("beta"))
    reconciler.tick()  # beta fits beside alpha's reserve: placed on the same card
    beta = one_replica(fleet, "beta")
    assert beta.placement[0].gpus == [0]
    obeying_agent(fleet, "n1")
    reconciler.tick()
    router.report()
    wait(fleet, clock, 5)
    router.report(waiting={"alpha": 1})
    reconciler.tick()
    alpha = one_replica(fleet, "alpha")
    assert beta.state == ReplicaState.SLEEPING, "beta makes way by sleeping, not stopping"
    assert fleet.reservations["alpha"].wake == alpha.id
    assert alpha.state == ReplicaState.ASLEEP, "not awake beside beta"
    router.report(waiting={"alpha": 1, "beta": 1})
    reconciler.tick()
    assert beta.state == ReplicaState.SLEEPING, "a victim is not revived by its own demand"
    obeying_agent(fleet, "n1")  # beta falls asleep
    assert beta.state == ReplicaState.ASLEEP
    reconciler.tick()
    assert alpha.state == ReplicaState.WAKING
    obeying_agent(fleet, "n1")
    assert alpha.state == ReplicaState.READY
    assert fleet.swap_totals == {"alpha": 1}
    assert any("making way to wake" in e for _, e in fleet.events["alpha"])


def test_a_replica_wanted_again_before_its_engine_sleeps_serves_at_once(make_fleet, clock):
    fleet, reconciler, router = asleep_alpha(make_fleet, clock)
    alpha = one_replica(fleet, "alpha")
    assert alpha.state == ReplicaState.SLEEPING and alpha.sleep == 0
    router.report(waiting={"alpha": 1})
    reconciler.tick()
    assert alpha.state == ReplicaState.READY and "wanted again before it slept" in alpha.reason
    assert [r["id"] for r in reconciler.routes.routes["alpha"]] == [alpha.id]


def test_a_replica_of_unknown_use_never_sleeps(make_fleet, clock):
    fleet, reconciler = make_fleet()
    router = ReportingRouter(fleet, reconciler)
    silent = ReportingRouter(fleet, reconciler, name="cut")
    fleet.register(node())
    fleet.apply(sleepy("alpha"))
    reconciler.tick()
    obeying_agent(fleet, "n1")
    reconciler.tick()
    silent.report()
    router.report()
    for _ in range(10):
        wait(fleet, clock, 30)
        router.report()
        reconciler.tick()
    assert one_replica(fleet, "alpha").state == ReplicaState.READY


def test_no_sleep_at_level_1_without_the_host_memory_for_the_weights(make_fleet, clock):
    fleet, reconciler, _ = asleep_alpha(make_fleet, clock, host_mb=1024)
    assert one_replica(fleet, "alpha").state == ReplicaState.READY


def test_level_2_needs_no_host_memory(make_fleet, clock):
    fleet, _, _ = asleep_alpha(make_fleet, clock, host_mb=0, sleep={"level": 2, "after": "60s"})
    assert one_replica(fleet, "alpha").state == ReplicaState.SLEEPING


def test_a_sleeper_that_does_not_wake_in_time_is_restarted_cold(make_fleet, clock):
    fleet, reconciler, router = asleep_alpha(make_fleet, clock)
    put_to_sleep(fleet, reconciler, router)
    router.report(waiting={"alpha": 1})
    reconciler.tick()
    alpha = one_replica(fleet, "alpha")
    assert alpha.state == ReplicaState.WAKING
    wait(fleet, clock, 31)
    router.report(waiting={"alpha": 1})
    reconciler.tick()
    assert alpha.state == ReplicaState.FAILED
    assert "did not wake within 30s: restarted cold" in alpha.reason
    assert [r.id for r in fleet.replicas_of("alpha")] == [alpha.id], (
        "its engine may still be waking: its card holds it until its agent says it is gone"
    )
    fleet.heartbeat("n1", {"replicas": {alpha.id: {"state": "Stopping"}}})
    reconciler.tick()
    assert [r.id for r in fleet.replicas_of("alpha")] == [alpha.id], "stopping, not yet gone"
    fleet.heartbeat("n1", {"replicas": {}})
    reconciler.tick()
    assert any(r.state == ReplicaState.PENDING for r in fleet.replicas_of("alpha")), (
        "a cold start in its place, once its engine is gone"
    )


def test_a_sleeper_idle_past_scale_to_zero_after_stops(make_fleet, clock):
    fleet, reconciler, router = asleep_alpha(make_fleet, clock, scale_to_zero_after="10m")
    put_to_sleep(fleet, reconciler, router)
    alpha = one_replica(fleet, "alpha")
    assert alpha.state == ReplicaState.ASLEEP
    wait(fleet, clock, 300)
    reconciler.tick()
    assert alpha.state == ReplicaState.ASLEEP, "asleep, not yet idle for 10m"
    wait(fleet, clock, 300)
    reconciler.tick()
    assert alpha.state == ReplicaState.STOPPING
    assert fleet.desired(fleet.specs["alpha"]) == 0, "scaled to zero through sleep"


def test_placement_counts_the_sleepers_memory(make_fleet, clock):
    fleet, reconciler, router = asleep_alpha(make_fleet, clock)
    put_to_sleep(fleet, reconciler, router)
    fleet.apply(spec(name="big", gpu_memory="79GiB"))  # 80,896 MiB + alpha's 1,024 > 81,559
    reconciler.tick()
    assert fleet.replicas_of("big") == []
    assert "cannot be placed" in fleet.reasons["big"]
    fleet.apply(spec(name="big", gpu_memory="70GB"))
    reconciler.tick()
    assert len(fleet.replicas_of("big")) == 1


def test_an_engine_is_told_its_share_of_each_card(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(node())
    fleet.apply(spec(name="half", gpu_memory="40GiB"))
    reconciler.tick()
    (assignment,) = fleet.assignments("n1")
    assert assignment["gpu_memory_utilization"] == "0.50"


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"sleep": {"level": 1}}, "engine", "required with sleep"),
        ({"engine": "vllm", "sleep": {"level": 3}}, "sleep.level", "1 (weights kept"),
        ({"engine": "vllm", "sleep": {"level": 1, "after": "soon"}}, "sleep.after", "duration"),
        ({"engine": "vllm", "sleep": {"level": 1, "when": "1m"}}, "sleep", "a map of"),
        ({"engine": "tgi"}, "engine", "one of vllm, sglang, llama.cpp"),
        ({"engine": {"sleep": "/s"}}, "engine", "exactly sleep, wake, asleep"),
        ({"gpu_memory": "60 parsecs"}, "gpu_memory", "unknown unit"),
        ({"gpu_memory": "lots"}, "gpu_memory", "a size such as 60GB"),
        ({"gpu_memory": 0}, "gpu_memory", "must be positive"),
        ({"command": ["x", "{gpu_memory_share}"]}, "command", "unknown placeholder"),
    ],
)
def test_bad_sleep_settings_are_refused_and_nothing_changes(make_fleet, changes, field, message):
    fleet, _ = make_fleet()
    before, _ = fleet.apply(sleepy("alpha"))
    with pytest.raises(BadRequest) as refused:
        fleet.apply(spec(name="alpha", **changes))
    assert refused.value.field == field and message in refused.value.message
    assert fleet.specs["alpha"].to_dict() == before.to_dict()
    reloaded, _ = make_fleet()
    assert reloaded.specs["alpha"].to_dict() == before.to_dict()


def test_a_read_back_spec_applies_unchanged(make_fleet):
    fleet, _ = make_fleet()
    stored, _ = fleet.apply(
        sleepy(
            "alpha",
            engine={"sleep": "/sleep?level={level}", "wake": "/wake_up", "asleep": "/is_sleeping"},
            gpu_memory="60GB",
            sleep_gpu_memory="2GiB",
            sleep_host_memory="30GB",
        )
    )
    assert stored.engine == "custom" and stored.gpu_memory_mb == 57220
    assert stored.sleep_gpu_memory_mb == 2048 and stored.sleep_after_s == 60
    _, outcome = fleet.apply(stored.to_dict())
    assert outcome == "unchanged"


def test_an_engine_asleep_by_itself_is_ready_all_the_same(make_fleet, clock):
    """llama.cpp sleeps by itself and the next request wakes it: it is shown Asleep, but it
    stays routed, holds its card and is stopped by scale to zero like any Ready replica."""
    fleet, reconciler = make_fleet()
    router = ReportingRouter(fleet, reconciler)
    fleet.register(node())
    fleet.apply(spec(name="llama", engine="llama.cpp", min_replicas=0, scale_to_zero_after="60s"))
    reconciler.tick()
    agent_says(fleet, "n1", lambda a: "Asleep")  # asleep before it was ever seen Ready
    llama = one_replica(fleet, "llama")
    assert llama.state == ReplicaState.READY and llama.engine_asleep
    reconciler.tick()
    assert [e["id"] for e in reconciler.routes.routes["llama"]] == [llama.id]
    assert fleet.held_gpus() == {("n1", 0)}
    (row,) = replica_rows(fleet.snapshot())
    assert row["state"] == "Asleep" and row["gpus"] == 1
    agent_says(fleet, "n1", lambda a: "Ready")
    assert not llama.engine_asleep
    assert any(m.endswith("woken by a request") for _, m in fleet.events["llama"])
    router.report()
    wait(fleet, clock, 61)
    agent_says(fleet, "n1", lambda a: "Asleep")
    router.report()
    reconciler.tick()
    assert llama.state == ReplicaState.RETIRING, "scaled to zero through the safe stop"

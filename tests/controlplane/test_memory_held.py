"""Memory held is what the card holds (controlplane/rules/held.py), tick by tick: the cases an
operator meets, each of which over-committed a card when memory was read from the spec and the
state's name."""

from collections import Counter

from controlplane.rules.held import memory_share
from controlplane.rules.room import RoomInputs
from controlplane.rules.sleep import memory_of, memory_stops
from controlplane.views.summary import replica_rows
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice
from tests.controlplane.conftest import ReportingRouter, as_placed, spec
from tests.controlplane.test_sleep import agent_says, node, obeying_agent, sleepy, wait

CARD_MB = 81559


def packed(name, gb, **kw):
    body = {"gpu_memory": f"{gb}GB", "replicas": 1, "min_replicas": 0, "min_residency": "0s"}
    return spec(name=name, **{**body, **kw})


def one_card(make_fleet):
    fleet, reconciler = make_fleet()
    fleet.register(node())
    return fleet, reconciler, ReportingRouter(fleet, reconciler)


def idle_past_sleep_after(fleet, reconciler, router, clock) -> None:
    """Its one replica unused past its sleep.after: its route goes, then (acknowledged) its
    engine is told to sleep."""
    router.report()
    wait(fleet, clock, 61)
    router.report()
    reconciler.tick()
    router.report()
    reconciler.tick()


def settle(fleet, reconciler, times=2):
    for _ in range(times):
        reconciler.tick()
        obeying_agent(fleet, "n1")


def test_a_deleted_model_draining_a_stream_keeps_its_card_until_its_engine_is_gone(
    make_fleet, clock
):
    fleet, reconciler, router = one_card(make_fleet)
    fleet.apply(packed("a", 60))
    settle(fleet, reconciler)
    (a,) = fleet.replicas_of("a")
    router.report(in_flight={a.id: 1})
    fleet.delete("a")
    reconciler.tick()
    assert a.state == ReplicaState.RETIRING, "its stream runs on"
    fleet.apply(packed("b", 40, min_replicas=1))
    router.report(in_flight={a.id: 1})
    reconciler.tick()
    assert fleet.replicas_of("b") == [], "60 + 40 GB do not fit on 80: b waits"
    router.report()  # the stream ended, the route is gone
    reconciler.tick()
    assert a.state == ReplicaState.STOPPING
    reconciler.tick()
    assert fleet.replicas_of("b") == [], "Stopping: its engine still holds its memory"
    fleet.heartbeat("n1", {"replicas": {}})  # its agent no longer runs it
    reconciler.tick()
    assert [r.model for r in fleet.replicas.values()] == ["b"]


def test_an_engine_told_to_sleep_holds_its_memory_until_its_agent_says_it_sleeps(
    make_fleet, clock
):
    fleet, reconciler, router = one_card(make_fleet)
    fleet.apply(sleepy("a", gpu_memory="60GB"))
    settle(fleet, reconciler)
    (a,) = fleet.replicas_of("a")
    idle_past_sleep_after(fleet, reconciler, router, clock)  # its engine is told to sleep
    assert a.state == ReplicaState.SLEEPING and a.sleep == 1
    fleet.apply(packed("b", 40, min_replicas=1))
    agent_says(fleet, "n1", lambda _: "Ready")  # still falling asleep
    reconciler.tick()
    assert fleet.replicas_of("b") == [], "its engine still holds 60 GB"
    agent_says(fleet, "n1", lambda _: "Asleep")
    reconciler.tick()
    assert a.state == ReplicaState.ASLEEP
    assert [r.state for r in fleet.replicas_of("b")] == [ReplicaState.PENDING], "beside it now"


def test_a_smaller_re_apply_changes_new_engines_not_the_running_one(make_fleet, clock):
    fleet, reconciler, router = one_card(make_fleet)
    fleet.apply(packed("a", 60))
    settle(fleet, reconciler)
    (a,) = fleet.replicas_of("a")
    started = fleet.assignments("n1")[0]["gpu_memory_utilization"]
    fleet.apply(packed("a", 20))
    assert fleet.assignments("n1")[0]["gpu_memory_utilization"] == started, "fixed at start"
    fleet.apply(packed("b", 40, min_replicas=1))
    reconciler.tick()
    assert fleet.replicas_of("b") == [], "a still holds 60 GB, whatever its spec says now"
    memory = memory_of(list(fleet.replicas.values()), fleet.specs, fleet.nodes)
    assert memory.used_on(("n1", 0)) >= 0.70 * CARD_MB, "60 GB: 0.70 of the card"


def test_the_share_an_engine_is_given_is_rounded_down():
    forty = ModelSpec(name="m", gpu_class="H100-80GB", command=["x"], gpu_memory_mb=40 * 953)
    assert 40 * 953 / CARD_MB > 0.465, "0.4674...: to the nearest would give 0.47"
    assert memory_share(forty, [CARD_MB]) == 0.46
    assert memory_share(forty, [CARD_MB, 40_960]) == 0.93, "of the smallest card"


def test_a_sleeper_over_its_reserve_is_degraded_and_counted_at_what_it_holds(make_fleet, clock):
    fleet, reconciler, router = one_card(make_fleet)
    fleet.apply(sleepy("a", gpu_memory="60GB"))
    settle(fleet, reconciler)
    (a,) = fleet.replicas_of("a")
    idle_past_sleep_after(fleet, reconciler, router, clock)
    settle(fleet, reconciler)
    assert a.state == ReplicaState.ASLEEP
    reserve = fleet.specs["a"].asleep_mb()

    def beat(mb):
        fleet.heartbeat("n1", {"replicas": {a.id: {"state": "Asleep", "gpu_memory_mb": mb}}})
        return {r["id"]: r for r in replica_rows(fleet.snapshot())}[a.id]

    assert beat(reserve)["state"] == "Asleep"
    row = beat(3 * reserve)
    assert row["state"] == "Degraded" and "over its asleep reserve" in row["reason"]
    memory = memory_of(list(fleet.replicas.values()), fleet.specs, fleet.nodes)
    assert memory.used_on(("n1", 0)) == 3 * reserve, "what NVML reads, not the reserve"


def test_a_room_that_cannot_be_made_takes_nothing(make_fleet, clock):
    fleet, reconciler, router = one_card(make_fleet)
    fleet.apply(sleepy("s", gpu_memory="30GB", sleep_gpu_memory="35GB"))
    settle(fleet, reconciler)
    idle_past_sleep_after(fleet, reconciler, router, clock)
    settle(fleet, reconciler)
    (s,) = fleet.replicas_of("s")
    assert s.state == ReplicaState.ASLEEP
    fleet.apply(packed("v", 40))
    settle(fleet, reconciler)
    (v,) = fleet.replicas_of("v")
    assert v.state == ReplicaState.READY and v.placement == s.placement, "beside the sleeper"
    body = sleepy("s", gpu_memory="30GB", sleep_gpu_memory="35GB", min_replicas=1)
    fleet.apply(body)  # the sleeper may no longer be stopped
    fleet.apply(packed("w", 50))
    router.report()
    wait(fleet, clock, 30)
    router.report(waiting={"w": 1})
    reconciler.tick()
    assert v.state == ReplicaState.READY, "v's going would not make room: s's reserve stays"
    assert s.state == ReplicaState.ASLEEP
    assert "min_replicas 1 keeps it" in fleet.reasons["w"]


def test_a_plan_counts_its_own_stops_against_min_replicas():
    card = Node("n1", "127.0.0.1", "f", [GPU(0, "g0", "H100-80GB", CARD_MB)])
    sleeper = ModelSpec(name="s", gpu_class="H100-80GB", command=["x"], replicas=2,
                        min_replicas=1, engine="vllm", sleep_level=2,
                        sleep_gpu_memory_mb=20_000)  # fmt: skip
    big = ModelSpec(name="big", gpu_class="H100-80GB", command=["x"], gpu_memory_mb=60_000)
    replicas = [
        Replica(f"s-{i}", "s", [Slice("n1", [0])], state=ReplicaState.ASLEEP, sleep=2)
        for i in range(2)
    ]
    as_placed(replicas, [sleeper, big], [card])
    inputs = RoomInputs(
        nodes=[card], replicas=replicas, specs={"s": sleeper, "big": big},
        desired={"s": 2, "big": 1}, idle={r.id: (600.0, IdleState.AT_LEAST) for r in replicas},
        in_flight={}, silent_holders={}, reserved={}, now=1e6, default_residency_s=0.0,
    )  # fmt: skip
    memory = memory_of(replicas, inputs.specs, {"n1": card})
    planned = Counter()
    moves = memory_stops(big, [("n1", 0)], inputs, memory, planned=planned)
    assert [m.action for m in moves] == ["stop", "blocked"], "s keeps one: its min_replicas"
    assert "min_replicas 1 keeps it" in moves[-1].why
    assert planned == {"s": 1}


def test_an_engine_reported_again_after_it_was_taken_for_gone_holds_its_card_again(
    make_fleet, clock
):
    fleet, reconciler, router = one_card(make_fleet)
    fleet.apply(packed("a", 60))
    settle(fleet, reconciler)
    (a,) = fleet.replicas_of("a")
    clock.advance(20)
    reconciler.tick()  # its node is silent past the timeout: a is lost with it
    assert a.state == ReplicaState.FAILED and a.lost
    fleet.heartbeat("n1", {"replicas": {}})  # back, its agent not yet reporting its engines
    assert a.gone_from == ["n1"]
    fleet.heartbeat("n1", {"replicas": {a.id: {"state": "Ready", "url": "http://x:1"}}})
    assert a.gone_from == [] and a.state == ReplicaState.READY, "it ran all along"
    memory = memory_of(list(fleet.replicas.values()), fleet.specs, fleet.nodes)
    assert memory.used_on(("n1", 0)) >= 0.70 * CARD_MB

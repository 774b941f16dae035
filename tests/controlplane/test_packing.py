"""Several engines awake on one card: placed by memory, the busy apart from each other, room
and wakes taken in memory rather than in cards."""

import os
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.agent.nvml import NvmlInventory, engine_of
from controlplane.rules.placement import CARD_RESERVE_MB, Placer
from controlplane.rules.room import RoomInputs, plan_room
from controlplane.rules.sleep import memory_of
from controlplane.state.fleet import BadRequest
from controlplane.views.summary import replica_rows
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice
from sim.fleet import parse_fleet
from tests.agent.fake_nvml import FakeGPU, FakeNvml
from tests.controlplane.conftest import ReportingRouter, as_placed, make_node, spec
from tests.controlplane.test_sleep import HOST_MB, obeying_agent, wait

CLASS = "H100-80GB"
CARD_MB = 81559  # what NVML says of an H100 80GB
GB = 953  # MiB in a GB, as specs count it
NOW = 1_000_000.0
ONE_CARD_FLEET = {"fabrics": [{"name": "f", "nodes": 1, "gpu_class": CLASS, "gpus_per_node": 1}]}


def model(name, gb=None, gpus=1):
    return ModelSpec(name=name, gpu_class=CLASS, command=["x"], gpus_per_replica=gpus,
                     gpu_memory_mb=None if gb is None else gb * GB)  # fmt: skip


def card_node(name="n1", cards=1):
    return Node(name, "127.0.0.1", "f1", [GPU(i, f"{name}-{i}", CLASS, CARD_MB)
                                          for i in range(cards)])  # fmt: skip


def test_three_small_models_share_one_card():
    placer = Placer([card_node()], set())
    placed = [placer.place(model(m, gb=20), 1).placements for m in ("a", "b", "c")]
    assert placed == [[[Slice("n1", [0])]]] * 3
    assert placer.used[("n1", 0)] == 3 * 20 * GB


def test_a_spec_without_gpu_memory_keeps_a_card_to_itself():
    placer = Placer([card_node(cards=2)], set())
    assert placer.place(model("big"), 1).placements == [[Slice("n1", [0])]]
    assert placer.place(model("small", gb=20), 1).placements == [[Slice("n1", [1])]]
    assert placer.place(model("small-2", gb=20), 1).placements == [[Slice("n1", [1])]]
    outcome = placer.place(model("other"), 1)
    assert outcome.placements == []
    assert "n1/1, has" in outcome.reason and "short by" in outcome.reason


def test_the_reason_says_which_card_is_short_and_by_how_much():
    used = {("n1", 0): 55 * GB}
    outcome = Placer([card_node()], set(), used).place(model("thirty", gb=30), 1)
    free = CARD_MB - CARD_RESERVE_MB - 55 * GB
    assert f"n1/0, has {free} MiB free of {CARD_MB}" in outcome.reason
    assert f"short by {30 * GB - free} MiB" in outcome.reason


def test_a_hot_model_takes_an_empty_card_a_quiet_one_is_packed():
    used = {("n1", 0): 20 * GB}
    load = {("n1", 0): 1.0}
    rates = {"hot": 10.0, "there": 1.0}  # a card's fair share: 5.5 requests a second
    placer = Placer([card_node(cards=2)], set(), used, load, rates=rates)
    assert placer.place(model("hot", gb=20), 1).placements == [[Slice("n1", [1])]], (
        "an empty card: compute is not shared"
    )
    placer = Placer([card_node(cards=2)], set(), used, load, rates=rates)
    assert placer.place(model("quiet", gb=20), 1).placements == [[Slice("n1", [0])]], (
        "packed beside a quiet engine: the empty card stays for a hot one"
    )


def test_with_no_empty_card_hot_models_go_apart_and_quiet_ones_avoid_hot_cards():
    used = {("n1", 0): 20 * GB, ("n1", 1): 30 * GB}
    load = {("n1", 0): 12.0, ("n1", 1): 1.0}  # a card's fair share: 6.5
    rates = {"b": 20.0, "on-0": 12.0, "on-1": 1.0}
    placer = Placer([card_node(cards=2)], set(), used, load, rates={**rates})
    assert placer.place(model("b", gb=20), 1).placements == [[Slice("n1", [1])]], "the quietest"
    placer = Placer([card_node(cards=2)], set(), dict(used), {("n1", 0): 1.0, ("n1", 1): 12.0},
                    rates={"on-0": 1.0, "on-1": 12.0})  # fmt: skip
    assert placer.place(model("c", gb=20), 1).placements == [[Slice("n1", [0])]], (
        "a quiet model: the fullest card that is not hot"
    )
    placer = Placer([card_node(cards=2)], set(), dict(used))
    assert placer.place(model("d", gb=20), 1).placements == [[Slice("n1", [1])]], (
        "nothing hot: the fullest, packed"
    )


def test_a_hot_models_empty_card_is_on_the_fullest_node_so_whole_nodes_stay_free():
    used = {("a", 0): 10 * GB}
    nodes = [card_node("a", cards=2), card_node("b", cards=2)]
    placer = Placer(nodes, set(), used, rates={"x": 5.0})
    assert placer.place(model("x", gb=20), 1).placements == [[Slice("a", [1])]]


def test_replicas_of_one_model_go_to_cards_apart():
    placer = Placer([card_node(cards=2)], set(), models_on={("n1", 0): {"a"}},
                    used={("n1", 0): 20 * GB})  # fmt: skip
    assert placer.place(model("a", gb=20), 2).placements == [[Slice("n1", [1])]]


def room_inputs(replicas, specs, in_flight=None, idle=None):
    return RoomInputs(
        nodes=[card_node()],
        replicas=as_placed(replicas, specs, [card_node()]),
        specs={s.name: s for s in specs},
        desired={s.name: 1 for s in specs},
        idle=idle or {r.id: (300.0, IdleState.EXACT) for r in replicas},
        in_flight=in_flight or {},
        silent_holders={},
        reserved={},
        now=NOW,
        default_residency_s=0.0,
    )


def awake(rid, name):
    return Replica(rid, name, [Slice("n1", [0])], state=ReplicaState.READY, ready_at=NOW - 600)


def three_awake_and_a_big_one_waiting(in_flight=None) -> RoomInputs:
    """a, b and c (20 GB each) awake on one card, b the idlest; big (40 GB) waits."""
    small = [model(m, gb=20) for m in ("a", "b", "c")]
    for s in small:
        s.min_replicas = 0
    replicas = [awake("a-1", "a"), awake("b-1", "b"), awake("c-1", "c")]
    idle = {"a-1": (100.0, IdleState.EXACT), "b-1": (900.0, IdleState.EXACT),
            "c-1": (50.0, IdleState.EXACT)}  # fmt: skip
    return room_inputs(replicas, [*small, model("big", 40)], in_flight, idle)


def test_room_takes_the_fewest_and_idlest_occupants_whose_memory_is_enough():
    plan = plan_room(model("big", gb=40), three_awake_and_a_big_one_waiting())
    assert [v.id for v in plan.victims] == ["b-1"], "one 20 GB engine is enough, the idlest"
    assert plan.placement == [Slice("n1", [0])]


def test_room_never_takes_an_occupant_with_a_request_in_flight():
    plan = plan_room(model("big", gb=40), three_awake_and_a_big_one_waiting({"b-1": 1}))
    assert [v.id for v in plan.victims] == ["a-1"], "b is busy: the next idlest goes"


def test_nothing_is_taken_when_the_waiting_model_fits_beside():
    small = model("a", gb=20)
    small.min_replicas = 0
    plan = plan_room(model("b", gb=20), room_inputs([awake("a-1", "a")], [small, model("b", 20)]))
    assert plan.victims == [] and plan.placement == [Slice("n1", [0])]


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.one_of(st.none(), st.integers(1, 90)), min_size=1, max_size=12),
    cards=st.integers(1, 3),
    loads=st.lists(st.integers(0, 5), min_size=3, max_size=3),
)
def test_no_card_holds_more_than_its_memory(sizes, cards, loads):
    load = {("n1", i): n for i, n in enumerate(loads)}
    placer = Placer([card_node(cards=cards)], set(), load=load)
    held: dict = {}
    for i, gb in enumerate(sizes):
        spec_ = model(f"m{i}", gb=gb)
        for slices in placer.place(spec_, 1).placements:
            for piece in slices:
                for index in piece.gpus:
                    held.setdefault(index, []).append(spec_.awake_mb(CARD_MB))
    for on_card in held.values():
        if len(on_card) > 1:
            assert sum(on_card) <= CARD_MB - CARD_RESERVE_MB
    for capacity in placer._by_class.values():  # its count of empty cards kept true
        free = [(n, i) for n, cards in capacity.free.items() for i in cards]
        assert capacity.empty == sum(1 for gpu in free if gpu not in capacity.shared)


# The fleet, tick by tick: three 20 GB models awake on one 80 GB card, then a fourth of 40 GB.


def packed(name, **kw):
    body = {"gpu_memory": "20GB", "replicas": 1, "min_replicas": 0, "min_residency": "0s"}
    return spec(name=name, **{**body, **kw})


def test_three_models_awake_on_one_card_then_a_fourth_puts_the_idlest_to_sleep(make_fleet, clock):
    fleet, reconciler = make_fleet()
    router = ReportingRouter(fleet, reconciler)
    fleet.register({**make_node("n1", gpus=1), "host_memory_mb": HOST_MB})
    for name in ("a", "b", "c"):
        fleet.apply(packed(name, engine="vllm", sleep={"level": 1, "after": "1h"}))
    reconciler.tick()
    obeying_agent(fleet, "n1")
    reconciler.tick()
    ready = {r.model: r for r in fleet.replicas.values() if r.state == ReplicaState.READY}
    assert sorted(ready) == ["a", "b", "c"]
    assert {r.placement[0].gpus[0] for r in ready.values()} == {0}
    assert sorted(reconciler.routes.routes) == ["a", "b", "c"]
    router.report(used={ready["a"].id: 1.0, ready["b"].id: 500.0, ready["c"].id: 30.0},
                  in_flight={ready["b"].id: 1})  # fmt: skip
    wait(fleet, clock, 5)
    fleet.apply(packed("d", gpu_memory="40GB"))
    router.report(used={ready["a"].id: 1.0, ready["b"].id: 500.0, ready["c"].id: 30.0},
                  in_flight={ready["b"].id: 1}, waiting={"d": 1})  # fmt: skip
    reconciler.tick()
    going = [r.model for r in fleet.replicas.values() if r.state == ReplicaState.SLEEPING]
    assert going == ["c"], "the idlest that nothing is in flight on"
    assert ready["b"].state == ReplicaState.READY, "never one with a request in flight"
    assert ready["a"].state == ReplicaState.READY, "one victim's memory is enough"
    memory = memory_of(list(fleet.replicas.values()), fleet.specs, fleet.nodes)
    assert memory.used_on(("n1", 0)) <= CARD_MB


def sleepy_packed(name, **kw):
    return packed(name, engine="vllm", sleep={"level": 1, "after": "60s", "wake_timeout": "30s"},
                  **kw)  # fmt: skip


def asleep_beside(make_fleet, clock, cards, a_fields, b_fields):
    """a asleep on card 0; b awake with a request in flight."""
    fleet, reconciler = make_fleet()
    router = ReportingRouter(fleet, reconciler)
    fleet.register({**make_node("n1", gpus=cards), "host_memory_mb": HOST_MB})
    fleet.apply(sleepy_packed("a", **a_fields))
    reconciler.tick()
    obeying_agent(fleet, "n1")
    reconciler.tick()
    router.report()
    wait(fleet, clock, 61)
    router.report()
    reconciler.tick()  # a idle past sleep.after: its route goes
    router.report()
    reconciler.tick()
    obeying_agent(fleet, "n1")
    reconciler.tick()
    (a,) = fleet.replicas_of("a")
    assert a.state == ReplicaState.ASLEEP
    if cards > 1:  # the other cards full for now: b goes beside a's sleeper
        fleet.apply(packed("filler", gpu_memory="70GB", replicas=cards - 1))
        reconciler.tick()
        obeying_agent(fleet, "n1")
        reconciler.tick()
    fleet.apply(packed("b", **b_fields))
    reconciler.tick()
    obeying_agent(fleet, "n1")
    reconciler.tick()
    (b,) = fleet.replicas_of("b")
    assert b.state == ReplicaState.READY and b.placement[0].gpus == [0], "beside a's sleeper"
    if cards > 1:  # and free again
        fleet.delete("filler")
        for _ in range(3):
            router.report(in_flight={b.id: 1})
            reconciler.tick()
            obeying_agent(fleet, "n1")
        assert fleet.replicas_of("filler") == []
    router.report(in_flight={b.id: 1})
    return fleet, reconciler, router, a, b


def test_a_sleeper_wakes_beside_a_busy_engine_when_its_memory_fits(make_fleet, clock):
    fleet, reconciler, router, a, b = asleep_beside(make_fleet, clock, 1, {}, {})
    router.report(in_flight={b.id: 1}, waiting={"a": 1})
    reconciler.tick()
    assert a.state == ReplicaState.WAKING, "no turn to take: both fit awake"
    assert b.state == ReplicaState.READY


def test_a_sleeper_blocked_for_a_while_starts_cold_where_memory_is_free(make_fleet, clock):
    whole = {"gpu_memory": "70GB"}
    fleet, reconciler, router, a, b = asleep_beside(make_fleet, clock, 2, whole, whole)
    router.report(in_flight={b.id: 1}, waiting={"a": 1})
    reconciler.tick()
    assert b.state == ReplicaState.READY, "in use: never taken"
    cold = [r for r in fleet.replicas_of("a") if r.id != a.id]
    assert len(cold) == 1 and cold[0].placement[0].gpus == [1], "a cold start on the free card"
    assert any("started cold on n1" in e for _, e in fleet.events["a"])


# What an engine takes of its card, as its agent reads it from NVML per process.


def test_an_engine_over_its_gpu_memory_is_degraded_and_says_why(make_fleet, clock):
    fleet, reconciler = make_fleet()
    fleet.register({**make_node("n1", gpus=1), "host_memory_mb": HOST_MB})
    fleet.apply(packed("a"))
    reconciler.tick()
    (a,) = fleet.replicas_of("a")
    allowed = fleet.specs["a"].gpu_memory_mb

    def beat(mb):
        fleet.heartbeat("n1", {"replicas": {a.id: {"state": "Ready", "url": "http://x:1",
                                                    "gpu_memory_mb": mb}}})  # fmt: skip
        return {r["id"]: r for r in replica_rows(fleet.snapshot())}[a.id]

    assert beat(int(allowed * 1.04))["state"] == "Ready", "within 5%"
    row = beat(int(allowed * 1.2) + 1)
    assert row["state"] == "Degraded" and "20% over its gpu_memory" in row["reason"]
    assert "starve its neighbours" in row["reason"]
    assert any("Degraded" in e for _, e in fleet.events["a"])
    assert beat(allowed)["state"] == "Ready", "back within its share"


def test_a_bad_memory_reading_is_refused_and_nothing_changes(make_fleet, clock):
    fleet, reconciler = make_fleet()
    fleet.register({**make_node("n1", gpus=1), "host_memory_mb": HOST_MB})
    fleet.apply(packed("a"))
    reconciler.tick()
    (a,) = fleet.replicas_of("a")
    before = a.to_dict()
    for bad in (-1, "lots", 1.5, True):
        report = {"replicas": {a.id: {"state": "Ready", "gpu_memory_mb": bad}}}
        with pytest.raises(BadRequest) as refused:
            fleet.heartbeat("n1", report)
        assert refused.value.field == f"replicas.{a.id}.gpu_memory_mb"
    assert a.to_dict() == before


def test_the_agent_reads_each_engines_memory_from_its_process_group():
    nvml = FakeNvml([FakeGPU(), FakeGPU()])
    me = os.getpid()
    nvml.processes = {0: [(me, 30 * 1024**3)], 1: [(me, 10 * 1024**3), (999_999_999, 5 * 1024**3)]}
    inventory = NvmlInventory(nvml, "n1", "127.0.0.1", None, watch_xids=False)
    run = SimpleNamespace(pid=os.getpgid(me))
    other = SimpleNamespace(pid=-7)
    assert inventory.replica_memory({"mine": run, "other": other}) == {"mine": 30 * 1024}


def test_where_getpgid_is_refused_the_process_tree_finds_the_engine(tmp_path):
    # NVML names pid 999999999 (no such process for getpgid here); /proc says its parent is
    # 999999998, whose parent is the engine 4242. A stat's name may hold ") (".
    for pid, parent in ((999_999_999, 999_999_998), (999_999_998, 4242), (4242, 1)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_bytes(f"{pid} (vllm ) (w) S {parent} 1 1".encode())
    assert engine_of(999_999_999, {4242: "a"}, str(tmp_path)) == (4242, "process tree")
    assert engine_of(999_999_999, {7: "b"}, str(tmp_path)) == (None, ""), "nobody's: left out"
    me = os.getpid()
    assert engine_of(me, {os.getpgid(me): "c"}) == (os.getpgid(me), "process group")


def test_the_agent_says_how_it_found_each_engines_memory():
    nvml = FakeNvml([FakeGPU()])
    me = os.getpid()
    nvml.processes = {0: [(me, 30 * 1024**3)]}
    inventory = NvmlInventory(nvml, "n1", "127.0.0.1", None, watch_xids=False)
    inventory.replica_memory({"mine": SimpleNamespace(pid=os.getpgid(me))})
    assert inventory.memory_source == "process group"
    inventory.replica_memory({})
    assert inventory.memory_source == "none found"


def test_a_simulated_card_counts_what_each_engine_was_told_unless_a_fault_says_more():
    (inventory,) = parse_fleet(ONE_CARD_FLEET)
    running = {"a": SimpleNamespace(memory_share=0.25), "b": SimpleNamespace(memory_share=0.5)}
    assert inventory.replica_memory(running) == {"a": int(0.25 * CARD_MB),
                                                 "b": int(0.5 * CARD_MB)}  # fmt: skip
    inventory.memory_taken["a"] = 40_000
    assert inventory.replica_memory(running)["a"] == 40_000

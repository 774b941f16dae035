"""Placement by popularity, in the rules that sleep, take room and wake: a model above a card's
fair share of the fleet's requests is kept warm, and the least asked make way first."""

from controlplane.rules.room import RoomInputs, plan_room
from controlplane.rules.sleep import plan_idle, plan_wake
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice
from tests.controlplane.conftest import as_placed

NOW = 1_000_000.0
CARD_MB = 81559


def model(name, gb, **kw):
    return ModelSpec(name=name, gpu_class="H100-80GB", command=["x"], gpu_memory_mb=gb * 953,
                     min_replicas=0, min_residency_s=0.0, engine="vllm", sleep_level=1,
                     sleep_after_s=30.0, **kw)  # fmt: skip


def cards(n):
    return [Node("n1", "127.0.0.1", "f", [GPU(i, f"g{i}", "H100-80GB", CARD_MB) for i in range(n)],
                 host_memory_mb=2 << 20)]  # fmt: skip


def inputs(nodes, replicas, specs, rates, idle=600.0):
    specs = {s.name: s for s in specs}
    return RoomInputs(
        nodes=nodes, replicas=as_placed(replicas, specs, nodes), specs=specs,
        desired={name: 1 for name in specs},
        idle={r.id: (idle, IdleState.AT_LEAST) for r in replicas}, in_flight={},
        silent_holders={}, reserved={}, now=NOW, default_residency_s=0.0, rates=rates,
    )  # fmt: skip


def ready(rid, name, card=0):
    return Replica(rid, name, [Slice("n1", [card])], state=ReplicaState.READY, ready_at=NOW - 900)


def test_a_hot_model_idle_past_sleep_after_stays_awake_a_quiet_one_sleeps():
    specs = [model("hot", 20), model("quiet", 20)]
    fleet = inputs(cards(2), [ready("hot-1", "hot"), ready("quiet-1", "quiet", 1)], specs,
                   rates={"hot": 2.0, "quiet": 0.01})  # fmt: skip
    moves = plan_idle(fleet, {}).moves
    assert [(m.replica.id, m.action) for m in moves] == [("quiet-1", "sleep")]


def test_a_hot_model_is_not_taken_for_a_less_popular_one_and_the_least_asked_goes_first():
    specs = [model("hot", 40), model("warm", 30), model("cool", 30), model("new", 45)]
    replicas = [ready("hot-1", "hot"), ready("warm-1", "warm", 1), ready("cool-1", "cool", 1)]
    rates = {"hot": 3.0, "warm": 0.2, "cool": 0.05, "new": 0.5}
    plan = plan_room(specs[-1], inputs(cards(2), replicas, specs, rates))
    assert [v.id for v in plan.victims] == ["cool-1"], "the least asked of the two quiet ones"
    kept = model("kept", 60)
    kept.min_replicas = 1
    specs = [model("hot", 60), kept, model("new", 40)]
    fleet = inputs(cards(2), [ready("hot-1", "hot"), ready("kept-1", "kept", 1)], specs,
                   {"hot": 3.0, "new": 0.5})  # fmt: skip
    plan = plan_room(specs[-1], fleet)
    assert plan.victims == [] and plan.placement is None
    assert "busy: 3.00 requests/s, more than new's" in plan.reason
    assert not plan.final, "it may pass: popularity changes"


def test_a_sleeper_wakes_where_its_card_is_quietest():
    specs = [model("m", 20), model("hot", 20)]
    asleep = [
        Replica(f"m-{i}", "m", [Slice("n1", [i])], state=ReplicaState.ASLEEP, sleep=1,
                slept_at=NOW - 100 * i)  # fmt: skip
        for i in range(2)
    ]
    hot = ready("hot-1", "hot", 0)
    fleet = inputs(cards(2), [*asleep, hot], specs, rates={"hot": 3.0, "m": 0.5})
    plan = plan_wake(specs[0], fleet, load={("n1", 0): 3.0})
    assert plan.replica.id == "m-1", "not beside the hot model, though m-0 slept last"
    assert plan_wake(specs[0], fleet).replica.id == "m-0", "no load known: the warmest cache"

"""Rebalancing over the whole tick: two models packed on one card that both turn busy are parted
(the quieter one starts on a free card and its old replica drains), no request is cut, and
the moved one is not moved again in its residency. The rule's edges are unit-tested on
`plan_rebalance`."""

import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.rules.placement import Placer
from controlplane.rules.rebalance import MIN_RESIDENCY_S, plan_rebalance
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice
from tests.controlplane.conftest import spec
from tests.controlplane.test_tick_property import World

NOW = 1_000_000.0


def cards_of(world, model):
    return sorted(
        (r.id, r.state.value, [(p.node, i) for p in r.placement for i in p.gpus])
        for r in world.fleet.replicas_of(model)
    )


def send(world, model, per_tick):
    """`per_tick` requests to `model`'s first routed replica, through the first router."""
    router = world.routers[0]
    for target in router.table.get(model, [])[:1]:
        router.requests[target] += per_tick
        router.used[target] = world.clock()


def test_two_busy_models_on_one_card_are_parted_without_a_cut(tmp_path):
    world = World(tmp_path, nodes=("n1",), gpus=4)
    try:
        for name in ("a", "b"):
            world.fleet.apply(spec(name=name, gpu_memory="30GB", min_replicas=1, replicas=1))
        for _ in range(3):
            world.tick(2.0)
        placed = {m: cards_of(world, m)[0][2] for m in ("a", "b")}
        assert placed["a"] == placed["b"] == [("n1", 0)], "quiet models pack on one card"
        old_b = cards_of(world, "b")[0][0]
        # b has a stream in flight on its old replica all along: the move must not cut it.
        world.routers[1].in_flight[old_b] += 1
        for _ in range(60):
            send(world, "a", 6)  # 3 requests/s at 2 s a tick
            send(world, "b", 3)  # 1.5 requests/s: both above a card's share (4.5 / 4 cards)
            world.tick(2.0)
        b = cards_of(world, "b")
        assert [c for _, state, c in b if state == "Ready"] == [[("n1", 1)]], b
        assert any(rid == old_b and state == "Retiring" for rid, state, _ in b), (
            "the old replica drains its stream: it is not stopped under it"
        )
        assert cards_of(world, "a")[0][2] == [("n1", 0)], "the busier one stays"
        world.routers[1].in_flight[old_b] -= 1
        for _ in range(5):
            send(world, "a", 6)
            send(world, "b", 3)
            world.tick(2.0)
        assert [rid for rid, *_ in cards_of(world, "b")] != [old_b]
        assert len(cards_of(world, "b")) == 1, "the old replica is gone once drained"
        moved = world.fleet.replicas_of("b")[0]
        assert moved.moved_in, "placed by a move: not moved again in its residency"
        events = " ".join(message for _, message in world.fleet.events["b"])
        assert "moved off n1/0" in events
    finally:
        world.close()


# The rule's edges, on one node of two cards.

def node():
    return Node("n1", "127.0.0.1", "f", [GPU(i, f"g{i}", "H100-80GB", 81559) for i in range(2)])


def model(name):
    return ModelSpec(name=name, gpu_class="H100-80GB", command=["x"], gpu_memory_mb=30_000)


def ready(rid, card=0, **kw):
    return Replica(rid, rid.split("-")[0], [Slice("n1", [card])], state=ReplicaState.READY,
                   ready_at=NOW - 2 * MIN_RESIDENCY_S, memory_share=0.37, **kw)  # fmt: skip


def plan(replicas, rates, specs=("a", "b", "c"), hot=0.5):
    load = {}
    for r in replicas:
        for p in r.placement:
            for i in p.gpus:
                load[(p.node, i)] = load.get((p.node, i), 0.0) + rates.get(r.id, 0.0)

    def placer():
        used = {}
        for r in replicas:
            for p in r.placement:
                for i in p.gpus:
                    used[(p.node, i)] = used.get((p.node, i), 0) + 30_000
        models_on = {}
        for r in replicas:
            for p in r.placement:
                for i in p.gpus:
                    models_on.setdefault((p.node, i), set()).add(r.model)
        by_model = {r.model: rates.get(r.id, 0.0) for r in replicas}
        return Placer([node()], set(), used, dict(load), models_on, by_model)

    return plan_rebalance(replicas, rates, load, hot, placer,
                          {name: model(name) for name in specs}, NOW)  # fmt: skip


def test_the_quieter_of_two_hot_models_on_one_card_moves_to_the_free_one():
    move = plan([ready("a-1"), ready("b-1")], {"a-1": 3.0, "b-1": 1.0})
    assert move.replica.id == "b-1" and move.card == ("n1", 0)
    assert [(s.node, s.gpus) for s in move.to] == [("n1", [1])]
    assert "ran 4.00 requests/s" in move.why


def test_no_move_when_it_would_not_narrow_the_gap():
    # Card 1 already runs 2.5: b's 1.0 there (3.5) is more than card 0 keeps without it (3.0).
    replicas = [ready("a-1"), ready("b-1"), ready("c-1", 1)]
    assert plan(replicas, {"a-1": 3.0, "b-1": 1.0, "c-1": 2.5}) is None


def test_no_move_for_the_young_the_moved_in_a_move_under_way_or_the_unasked():
    rates = {"a-1": 3.0, "b-1": 1.0}
    young = ready("b-1")
    young.ready_at = NOW - 5
    assert plan([ready("a-1"), young], rates) is None, "and a moving would not narrow the gap"
    assert plan([ready("a-1", moved_in=True), ready("b-1", moved_in=True)], rates) is None
    assert plan([ready("a-1"), ready("b-1"), ready("c-1", 1, moving="x")], rates) is None
    assert plan([ready("a-1"), ready("b-1")], {"a-1": 4.0}) is None, "b is never asked"
    assert plan([ready("a-1"), ready("b-1")], {"a-1": 4.0, "b-1": 0.3}) is None, (
        "b is asked, but less than a card's share: parting it from a would cost a cold start"
        " for little"
    )
    assert plan([ready("a-1")], {"a-1": 4.0}) is None, "one model alone is no pair to part"


phases = st.lists(
    st.tuples(
        st.dictionaries(st.sampled_from("abc"), st.sampled_from([0, 1, 4, 12]), min_size=1),
        st.integers(5, 60),  # ticks of 2 s
        st.sampled_from([None, "a", "b", "c"]),  # a stream opened on that model's replica
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(phases)
def test_moves_under_changing_rates_cut_nothing_and_happen_once_a_residency(history):
    with tempfile.TemporaryDirectory() as directory:
        world = World(Path(directory), nodes=("n1",), gpus=4)
        try:
            for name in "abc":
                world.fleet.apply(spec(name=name, gpu_memory="20GB", min_replicas=1, replicas=1))
            moves: Counter = Counter()  # model -> moves in the current residency
            for rates, ticks, stream in history:
                if stream:
                    for target in world.routers[1].table.get(stream, [])[:1]:
                        world.routers[1].in_flight[target] += 1
                for _ in range(ticks):
                    for model, per_tick in rates.items():
                        send(world, model, per_tick)
                    before = {r.id for r in world.fleet.replicas.values() if r.moving}
                    world.tick(2.0)  # World.check: nothing stopped under a request
                    for replica in world.fleet.replicas.values():
                        if replica.moving and replica.id not in before:
                            assert not replica.moved_in, "moved twice in one residency"
                            moves[replica.model] += 1
                    for model in "abc":
                        ready = [r for r in world.fleet.replicas_of(model)
                                 if r.state == ReplicaState.READY]  # fmt: skip
                        assert ready or world.clock() < NOW + 10, (model, "none Ready")
        finally:
            world.close()

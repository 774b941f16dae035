"""Making room as a pure step: cases an operator would name, then properties over random
fleets, uses and requests in flight."""

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.rules.room import RoomInputs, plan_room
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import (
    GPU,
    HOLDING,
    ModelSpec,
    Node,
    Replica,
    ReplicaState,
    Slice,
)

NOW = 1_000_000.0
CLASS = "H100-80GB"


def model(name, gpus=2, priority=0, floor=0, replicas=1, residency=0.0, nodes=1):
    return ModelSpec(
        name=name,
        gpu_class=CLASS,
        command=["x"],
        gpus_per_replica=gpus,
        nodes_per_replica=nodes,
        replicas=replicas,
        min_replicas=floor,
        priority=priority,
        min_residency_s=residency,
    )


def node(name, gpus=2, fabric="f1"):
    return Node(name, "127.0.0.1", fabric, [GPU(i, f"{name}-{i}", CLASS) for i in range(gpus)])


def replica(rid, model_name, node_name, gpus, ready_for=600.0, state=ReplicaState.READY):
    return Replica(
        rid, model_name, [Slice(node_name, list(gpus))], state=state, ready_at=NOW - ready_for
    )


def inputs(nodes, replicas, specs, idle=None, in_flight=None, silent=None, desired=None):
    specs = {s.name: s for s in specs}
    return RoomInputs(
        nodes=nodes,
        replicas=replicas,
        specs=specs,
        desired=desired or {name: 1 for name in specs},
        idle=idle or {r.id: (300.0, IdleState.EXACT) for r in replicas},
        in_flight=in_flight or {},
        silent_holders=silent or {},
        reserved={},
        now=NOW,
        default_residency_s=120.0,
    )


def test_an_idle_replica_of_another_model_is_taken():
    alpha, beta = model("alpha"), model("beta")
    fleet = inputs([node("n1")], [replica("alpha-1", "alpha", "n1", [0, 1])], [alpha, beta])
    plan = plan_room(beta, fleet)
    assert [v.id for v in plan.victims] == ["alpha-1"]
    assert plan.placement == [Slice("n1", [0, 1])]


def test_what_blocks_is_named_per_replica():
    alpha, gamma, delta, beta = model("alpha", 1), model("gamma", 1), model("delta", 1), model("b")
    replicas = [
        replica("alpha-1", "alpha", "n1", [0]),
        replica("gamma-1", "gamma", "n1", [1]),
        replica("delta-1", "delta", "n2", [0], ready_for=40),
    ]
    idle = {
        "alpha-1": (0.0, IdleState.EXACT),
        "gamma-1": (-1.0, IdleState.UNKNOWN),
        "delta-1": (30.0, IdleState.AT_LEAST),
    }
    fleet = inputs(
        [node("n1"), node("n2", gpus=1)],
        replicas,
        [alpha, gamma, delta, beta, model("x")],
        idle=idle,
        in_flight={"alpha-1": 2},
        silent={"gamma-1": "r2"},
    )
    plan = plan_room(model("b"), fleet)
    assert plan.placement is None and not plan.final, "all of it may pass"
    assert plan.reason == "alpha-1: 2 requests in flight; gamma-1: use unknown: silent router r2"
    # delta's node has one GPU: it could never hold b, so delta is not what blocks it.
    delta_spec = model("delta", 1, residency=120)
    young = replica("delta-1", "delta", "n3", [0], ready_for=40)
    fleet = inputs([node("n3", gpus=1)], [young], [delta_spec, model("c", 1)], idle=idle)
    assert plan_room(model("c", 1), fleet).reason == "delta-1: min_residency 2m: Ready 40s"


def test_protected_for_good_is_final_and_said_so():
    vip, low = model("vip", priority=5), model("low", priority=0)
    fleet = inputs([node("n1")], [replica("vip-1", "vip", "n1", [0, 1])], [vip, low])
    plan = plan_room(low, fleet)
    assert plan.final and plan.reason == "vip-1: priority 5 above low's 0"
    kept = model("kept", floor=1)
    fleet = inputs([node("n1")], [replica("kept-1", "kept", "n1", [0, 1])], [kept, low])
    plan = plan_room(low, fleet)
    assert plan.final and plan.reason == "kept-1: min_replicas 1 keeps it"
    # Too big for any node, even empty: final, nothing to name.
    plan = plan_room(model("huge", gpus=4), inputs([node("n1")], [], [model("huge", gpus=4)]))
    assert plan.final and plan.placement is None and not plan.blockers


def test_a_higher_priority_takes_from_a_lower_and_never_the_reverse():
    low, high = model("low", priority=0), model("high", priority=3)
    fleet = inputs([node("n1")], [replica("low-1", "low", "n1", [0, 1])], [low, high])
    assert [v.id for v in plan_room(high, fleet).victims] == ["low-1"]
    fleet = inputs([node("n1")], [replica("high-1", "high", "n1", [0, 1])], [low, high])
    assert plan_room(low, fleet).victims == []


def test_the_fewest_gpus_then_the_lowest_priority_then_the_longest_idle():
    a, b, c, w = model("a", 1, priority=1), model("b", 1), model("c", 2), model("w", 1, priority=2)
    replicas = [
        replica("a-1", "a", "n1", [0]),
        replica("b-1", "b", "n2", [0]),
        replica("c-1", "c", "n3", [0, 1]),
        replica("b-2", "b", "n4", [0]),
    ]
    nodes = [node("n1", 1), node("n2", 1), node("n3", 2), node("n4", 1)]
    idle = {
        "a-1": (900.0, IdleState.EXACT),
        "b-1": (100.0, IdleState.EXACT),
        "c-1": (5000.0, IdleState.EXACT),
        "b-2": (400.0, IdleState.AT_LEAST),
    }
    fleet = inputs(nodes, replicas, [a, b, c, w], idle=idle, desired={"a": 1, "b": 2, "c": 1})
    # One GPU beats two however idle; priority 0 beats 1; then b-2, idle longer than b-1.
    assert [v.id for v in plan_room(w, fleet).victims] == ["b-2"]


def test_whole_nodes_of_one_fabric_for_a_replica_that_spans_nodes():
    wide = model("wide", gpus=2, nodes=2)
    small = model("small", 1)
    nodes = [node("a1", fabric="fa"), node("a2", fabric="fa"), node("b1", fabric="fb")]
    replicas = [replica("small-1", "small", "a2", [1]), replica("small-2", "small", "b1", [0])]
    fleet = inputs(nodes, replicas, [wide, small], desired={"small": 2})
    plan = plan_room(wide, fleet)
    assert [v.id for v in plan.victims] == ["small-1"]
    assert [p.node for p in plan.placement] == ["a1", "a2"]


# Properties over random fleets.


def test_cards_held_on_the_way_out_or_kept_for_another_are_a_wait_not_a_refusal():
    """A blocker that passes (a replica Retiring or Stopping, whose model already counts it
    gone; GPUs kept for another waiting model) means wait: never a final refusal."""
    alpha, beta = model("alpha"), model("beta")
    for state, beta_keeps in (
        (ReplicaState.RETIRING, 0),
        (ReplicaState.STOPPING, 0),
        (ReplicaState.STARTING, 1),
    ):
        held = replica("beta-1", "beta", "n1", [0, 1], state=state)
        keeps = {"alpha": 1, "beta": beta_keeps}
        plan = plan_room(alpha, inputs([node("n1")], [held], [alpha, beta], desired=keeps))
        assert plan.placement is None and not plan.final, (state, plan)
        assert f"beta-1: {state}, not Ready" in plan.reason
    one = model("one", gpus=1)
    fleet = inputs([node("n1")], [], [one, alpha])
    kept = RoomInputs(**{**fleet.__dict__, "reserved": {("n1", 0): "alpha", ("n1", 1): "alpha"}})
    plan = plan_room(one, kept)
    assert plan.placement is None and not plan.final
    assert "GPUs kept for alpha" in plan.reason


def test_min_replicas_counts_the_replicas_that_exist_not_the_ones_it_should_have():
    alpha, beta = model("alpha", floor=1, replicas=3), model("beta")
    replicas = [
        replica("alpha-1", "alpha", "n1", [0, 1]),
        replica("alpha-2", "alpha", "n2", [0, 1], state=ReplicaState.STARTING),
        replica("alpha-3", "alpha", "n3", [0, 1], state=ReplicaState.STARTING),
    ]
    nodes = [node("n1"), node("n2"), node("n3")]
    plan = plan_room(beta, inputs(nodes, replicas, [alpha, beta], desired={"alpha": 3}))
    assert plan.victims == [], "its one Ready replica is all alpha has: min_replicas 1"
    assert not plan.final, "once the others are Ready, one may go"
    assert "min_replicas 1: 1 Ready" in plan.reason


@st.composite
def fleets(draw):
    specs = [
        model(
            f"m{k}",
            gpus=draw(st.integers(1, 3)),
            priority=draw(st.integers(0, 2)),
            floor=draw(st.sampled_from([0, 0, 1])),
            replicas=3,
            residency=draw(st.sampled_from([0.0, 120.0])),
        )
        for k in range(draw(st.integers(2, 4)))
    ]
    nodes = [node(f"n{i}", gpus=draw(st.integers(1, 4))) for i in range(draw(st.integers(1, 4)))]
    replicas, idle, in_flight, silent = [], {}, {}, {}
    for n in nodes:
        free = [g.index for g in n.gpus]
        # Mostly full nodes: room has to be made, and there is more than one way to make it.
        while free and draw(st.integers(0, 5)):
            spec = draw(st.sampled_from(specs))
            taken, free = free[: spec.gpus_per_replica], free[spec.gpus_per_replica :]
            rid = f"{spec.name}-{len(replicas)}"
            replicas.append(
                replica(
                    rid,
                    spec.name,
                    n.name,
                    taken,
                    ready_for=draw(st.sampled_from([10.0, 600.0])),
                    state=draw(st.sampled_from([ReplicaState.READY] * 5 + [ReplicaState.STARTING])),
                )
            )
            state = draw(st.sampled_from([IdleState.EXACT, IdleState.AT_LEAST, IdleState.UNKNOWN]))
            idle[rid] = (
                (-1.0, state) if state == IdleState.UNKNOWN else (draw(st.floats(0, 9999)), state)
            )
            if state == IdleState.UNKNOWN and draw(st.booleans()):
                silent[rid] = "r9"
            if draw(st.integers(0, 4)) == 0:
                in_flight[rid] = draw(st.integers(1, 3))
    # What each model should keep is drawn apart from what it has: scaled out and still
    # starting, or scaled in with surplus still Ready.
    desired = {
        s.name: max(0, sum(r.model == s.name for r in replicas) + draw(st.integers(-1, 2)))
        for s in specs
    }
    waiting = draw(st.sampled_from(specs))
    # Most often a model of the highest priority waits: it may take from every other.
    if draw(st.booleans()):
        waiting = max(specs, key=lambda s: s.priority)
    fleet = RoomInputs(
        nodes=nodes,
        replicas=replicas,
        specs={s.name: s for s in specs},
        desired=desired,
        idle=idle,
        in_flight=in_flight,
        silent_holders=silent,
        reserved={},
        now=NOW,
        default_residency_s=120.0,
    )
    return waiting, fleet


def frees_a_placement(waiting, fleet, victims) -> bool:
    gone = {v.id for v in victims}
    held = {
        (p.node, i)
        for r in fleet.replicas
        if r.state in HOLDING and r.id not in gone
        for p in r.placement
        for i in p.gpus
    }
    return any(
        sum((n.name, g.index) not in held for g in n.gpus) >= waiting.gpus_per_replica
        for n in fleet.nodes
    )


def allowed(waiting, fleet, victims) -> bool:
    """DESIGN.md's rules for a victim, written out here rather than asked of the code."""
    for v in victims:
        spec = fleet.specs[v.model]
        if (
            v.model == waiting.name
            or v.state != ReplicaState.READY
            or fleet.idle[v.id][1] == IdleState.UNKNOWN
            or fleet.in_flight.get(v.id)
            or spec.priority > waiting.priority
            or NOW - v.ready_at < spec.min_residency_s
        ):
            return False
    for name, spec in fleet.specs.items():
        taken = sum(v.model == name for v in victims)
        ready = sum(r.model == name and r.state == ReplicaState.READY for r in fleet.replicas)
        if taken and (ready - taken < spec.floor or fleet.desired[name] - taken < spec.floor):
            return False
    return True


@settings(max_examples=1500, deadline=None)
@given(fleets())
def test_victims_are_never_in_use_unknown_protected_or_above_and_the_set_is_smallest(drawn):
    waiting, fleet = drawn
    plan = plan_room(waiting, fleet)
    for victim in plan.victims:
        assert victim.model != waiting.name
        assert victim.state == ReplicaState.READY
        assert fleet.idle[victim.id][1] != IdleState.UNKNOWN
        assert not fleet.in_flight.get(victim.id)
        assert fleet.specs[victim.model].priority <= waiting.priority
        assert NOW - victim.ready_at >= fleet.specs[victim.model].min_residency_s
    if plan.victims:
        assert allowed(waiting, fleet, plan.victims)
        assert frees_a_placement(waiting, fleet, plan.victims)
    # No smaller allowed set (fewer GPUs) frees a placement, and none at all when none found.
    cost = sum(v.gpu_count for v in plan.victims) if plan.placement else float("inf")
    held = [r for r in fleet.replicas if r.state in HOLDING]
    for size in range(0, len(held) + 1):
        for subset in combinations(held, size):
            if sum(r.gpu_count for r in subset) >= cost:
                continue
            if allowed(waiting, fleet, subset):
                assert not frees_a_placement(waiting, fleet, subset), (subset, plan)

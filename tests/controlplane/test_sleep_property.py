"""Sleep and wake plans as pure steps, over random fleets of awake replicas and sleepers:
never a sleeper whose memory does not fit, never a victim in use or of unknown use, never
host memory spent that a node does not have. The rules are written out here, not asked of
the code."""

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.rules.room import RoomInputs
from controlplane.rules.sleep import plan_idle, plan_wake
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice
from tests.controlplane.conftest import as_placed

NOW = 1_000_000.0
CLASS = "H100-80GB"
CARD = 81559


def model(draw, name):
    level = draw(st.sampled_from([None, 1, 2]))
    return ModelSpec(
        name=name,
        gpu_class=CLASS,
        command=["x"],
        gpus_per_replica=draw(st.integers(1, 2)),
        replicas=3,
        min_replicas=draw(st.sampled_from([0, 0, 1])),
        priority=draw(st.integers(0, 2)),
        min_residency_s=draw(st.sampled_from([0.0, 120.0])),
        engine="vllm",
        sleep_level=level,
        sleep_after_s=draw(st.sampled_from([60.0, 600.0])) if level else None,
        gpu_memory_mb=draw(st.sampled_from([None, 40_000, 60_000, 75_000])),
        sleep_gpu_memory_mb=draw(st.sampled_from([None, 2_000, 8_000, 20_000])),
        sleep_host_memory_mb=draw(st.sampled_from([None, 30_000, 120_000])),
    )


@st.composite
def fleets(draw):
    specs = [model(draw, f"m{k}") for k in range(draw(st.integers(2, 4)))]
    nodes = [
        Node(
            f"n{i}",
            "127.0.0.1",
            "f1",
            [GPU(g, f"n{i}-{g}", CLASS, CARD) for g in range(2)],
            host_memory_mb=draw(st.sampled_from([0, 100_000, 400_000, 2_000_000])),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    replicas, idle, in_flight, silent = [], {}, {}, {}

    def add(spec, node, gpus, state):
        rid = f"{spec.name}-{len(replicas)}"
        sleep = (spec.sleep_level or 1) if state == ReplicaState.ASLEEP else 0
        replicas.append(
            Replica(
                rid,
                spec.name,
                [Slice(node.name, gpus)],
                state=state,
                ready_at=NOW - draw(st.sampled_from([10.0, 600.0])),
                sleep=sleep,
                slept_at=NOW - draw(st.floats(0, 900)) if sleep else 0.0,
            )
        )
        kind = draw(st.sampled_from([IdleState.EXACT, IdleState.AT_LEAST, IdleState.UNKNOWN]))
        idle[rid] = (-1.0, kind) if kind == IdleState.UNKNOWN else (draw(st.floats(0, 999)), kind)
        if kind == IdleState.UNKNOWN and draw(st.booleans()):
            silent[rid] = "r9"
        if draw(st.integers(0, 4)) == 0:
            in_flight[rid] = draw(st.integers(1, 3))

    for node in nodes:
        free = [0, 1]
        while free and draw(st.integers(0, 3)):
            spec = draw(st.sampled_from(specs))
            if spec.gpus_per_replica > len(free):
                break
            taken, free = free[: spec.gpus_per_replica], free[spec.gpus_per_replica :]
            add(
                spec,
                node,
                taken,
                draw(st.sampled_from([ReplicaState.READY] * 4 + [ReplicaState.STARTING])),
            )
        for _ in range(draw(st.integers(0, 3))):
            sleeper = draw(st.sampled_from([s for s in specs if s.sleep_level] or specs))
            if sleeper.sleep_level is None:
                break
            add(sleeper, node, [0, 1][: sleeper.gpus_per_replica], ReplicaState.ASLEEP)
    desired = {s.name: max(1, sum(r.model == s.name for r in replicas)) for s in specs}
    inputs = RoomInputs(
        nodes=nodes,
        replicas=as_placed(replicas, specs, nodes),
        specs={s.name: s for s in specs},
        desired=desired,
        idle=idle,
        in_flight=in_flight,
        silent_holders=silent,
        reserved={},
        now=NOW,
        default_residency_s=120.0,
    )
    return draw(st.sampled_from(specs)), inputs


def may_be_taken(victim, waiting, inputs) -> bool:
    """DESIGN.md's victim rules for an awake replica."""
    spec = inputs.specs[victim.model]
    return (
        victim.model != waiting.name
        and victim.state == ReplicaState.READY
        and inputs.idle[victim.id][1] != IdleState.UNKNOWN
        and not inputs.in_flight.get(victim.id)
        and spec.priority <= waiting.priority
        and NOW - victim.ready_at >= (spec.min_residency_s or 0)
    )


def memory_after(inputs, woken, moves):
    """GPU reserve per card and host memory per node once the moves are made and `woken`
    wakes."""
    gone = {m.replica.id for m in moves if m.action == "stop"}
    slept = {m.replica.id for m in moves if m.action == "sleep"}
    reserve, host = {}, {}
    for r in inputs.replicas:
        asleep = (r.state == ReplicaState.ASLEEP and r.id not in gone) or r.id in slept
        if not asleep or (woken is not None and r.id == woken.id):
            continue
        spec = inputs.specs[r.model]
        for p in r.placement:
            for i in p.gpus:
                reserve[(p.node, i)] = reserve.get((p.node, i), 0) + spec.asleep_mb()
                host[p.node] = host.get(p.node, 0) + spec.host_mb(CARD)
    return reserve, host


@settings(max_examples=800, deadline=None)
@given(fleets())
def test_a_wake_plan_takes_no_one_in_use_and_fits_its_memory(drawn):
    waiting, inputs = drawn
    before_reserve, before_host = memory_after(inputs, None, [])
    plan = plan_wake(waiting, inputs)
    if plan.replica is None:
        assert plan.moves == []
        return
    woken = plan.replica
    assert woken.model == waiting.name and woken.state == ReplicaState.ASLEEP
    for move in plan.moves:
        assert move.action in ("sleep", "stop")
        if move.replica.state == ReplicaState.ASLEEP:
            assert move.action == "stop", "a sleeper only ever stops"
            continue
        assert may_be_taken(move.replica, waiting, inputs), move
        if move.action == "sleep":
            assert inputs.specs[move.replica.model].sleeps
    reserve, host = memory_after(inputs, woken, plan.moves)
    moved = {m.replica.id for m in plan.moves}
    for piece in woken.placement:
        for i in piece.gpus:
            holders = [
                r
                for r in inputs.replicas
                if r.state not in (ReplicaState.ASLEEP,)
                and r.id not in moved
                and any(p.node == piece.node and i in p.gpus for p in r.placement)
            ]
            assert not holders, "nothing else awake on the woken replica's cards"
            assert waiting.awake_mb(CARD) + reserve.get((piece.node, i), 0) <= CARD
    for node in inputs.nodes:
        if host.get(node.name, 0) > before_host.get(node.name, 0):
            assert host[node.name] <= node.host_memory_mb, "host memory it does not have"
    del before_reserve


@settings(max_examples=800, deadline=None)
@given(fleets())
def test_idle_sleeps_are_of_known_idle_replicas_past_sleep_after_within_host_memory(drawn):
    _, inputs = drawn
    plan = plan_idle(inputs, {})
    _, before_host = memory_after(inputs, None, [])
    for move in plan.moves:
        spec = inputs.specs[move.replica.model]
        if move.action == "stop":
            assert move.replica.state == ReplicaState.ASLEEP
            continue
        assert move.replica.state == ReplicaState.READY and spec.sleeps
        seconds, state = inputs.idle[move.replica.id]
        assert state != IdleState.UNKNOWN and seconds >= spec.sleep_after_s
        assert not inputs.in_flight.get(move.replica.id)
    _, host = memory_after(inputs, None, plan.moves)
    for node in inputs.nodes:
        if host.get(node.name, 0) > before_host.get(node.name, 0):
            assert host[node.name] <= node.host_memory_mb
    for name, spec in inputs.specs.items():
        ready = sum(r.model == name and r.state == ReplicaState.READY for r in inputs.replicas)
        slept = sum(m.replica.model == name and m.action == "sleep" for m in plan.moves)
        assert slept == 0 or ready - slept >= spec.floor, "never below min_replicas awake"

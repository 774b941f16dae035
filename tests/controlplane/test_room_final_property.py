"""DESIGN's "Final or not", over every state a blocking replica can be in: a waiting model is
told at once that no room can be made only when no node could ever hold it, counting as
staying only what is protected for good (a higher priority; a model at its min_replicas that
has no replica to shed; the waiting model's own replicas that serve). Everything else (young,
busy, unknown, starting, sleeping, on its way out, GPUs kept for another model) means wait.

The oracle states the rule itself, node by node; it does not call the planner's search."""

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.rules.room import RoomInputs, plan_room
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import GPU, HOLDING, Node, ReplicaState
from tests.controlplane.conftest import as_placed
from tests.controlplane.test_room import CLASS, NOW, model, replica

LEAVING = {ReplicaState.RETIRING, ReplicaState.STOPPING}
STATES = sorted(HOLDING | {ReplicaState.ASLEEP, ReplicaState.FAILED})
IDLE = st.sampled_from(
    [(300.0, IdleState.EXACT), (300.0, IdleState.AT_LEAST), (-1.0, IdleState.UNKNOWN)]
)


@st.composite
def fleets(draw):
    nodes, free = [], []
    for n in range(draw(st.integers(1, 2))):
        healthy = draw(st.lists(st.booleans(), min_size=1, max_size=4))
        gpus = [GPU(i, f"n{n}-{i}", CLASS, healthy=h) for i, h in enumerate(healthy)]
        nodes.append(Node(f"n{n}", "127.0.0.1", "f1", gpus))
        free += [(f"n{n}", i) for i in range(len(gpus))]
    waiting = model("w", gpus=draw(st.integers(1, 4)), priority=0, floor=0)
    specs, desired = {"w": waiting}, {"w": 1}
    for k in range(draw(st.integers(0, 3))):
        name = f"x{k}"
        specs[name] = model(
            name,
            priority=draw(st.sampled_from([-1, 0, 1])),
            floor=draw(st.integers(0, 1)),
            replicas=draw(st.integers(1, 2)),
        )
        desired[name] = draw(st.integers(0, 2))
    replicas, idle, in_flight = [], {}, {}
    for r in range(draw(st.integers(0, 5))):
        if not free:
            break
        owner = draw(st.sampled_from(sorted(specs)))
        where = draw(st.sampled_from(sorted({n for n, _ in free})))
        spots = [i for n, i in free if n == where]
        count = draw(st.integers(1, min(2, len(spots))))
        gpus = spots[:count]
        free = [(n, i) for n, i in free if not (n == where and i in gpus)]
        state = draw(st.sampled_from(STATES))
        ready_for = draw(st.sampled_from([5.0, 600.0]))
        rid = f"{owner}-{r}"
        replicas.append(replica(rid, owner, where, gpus, ready_for=ready_for, state=state))
        idle[rid] = draw(IDLE)
        if draw(st.booleans()):
            in_flight[rid] = 1
    reserved = {gpu: "other" for gpu in free if draw(st.integers(0, 3)) == 0}
    inputs = RoomInputs(
        nodes=nodes,
        replicas=as_placed(replicas, specs, nodes),
        specs=specs,
        desired=desired,
        idle=idle,
        in_flight=in_flight,
        silent_holders={},
        reserved=reserved,
        now=NOW,
        default_residency_s=120.0,
    )
    return waiting, inputs


def could_ever_fit(waiting, inputs) -> bool:
    """Some node has, of its usable GPUs, enough that are free or held by what may go."""
    specs = inputs.specs
    shed = defaultdict(int)  # model -> replicas it keeps, not on their way out
    for r in inputs.replicas:
        if r.state in HOLDING and r.state not in LEAVING:
            shed[r.model] += 1
    # A model may lose, some day, what it keeps above its floor, and whatever it has beyond
    # what it keeps (a scale-in sheds those anyway).
    may_lose = {
        name: max(0, inputs.desired[name] - s.floor) + max(0, shed[name] - inputs.desired[name])
        for name, s in specs.items()
    }
    for node in inputs.nodes:
        usable = {g.index for g in node.gpus if g.healthy}
        if len(usable) < waiting.gpus_per_replica:
            continue
        holders = [
            r for r in inputs.replicas if r.state in HOLDING and r.placement[0].node == node.name
        ]
        held = {i for r in holders for i in r.placement[0].gpus}
        freeable = len(usable - held)
        by_model = defaultdict(list)
        for r in holders:
            gained = len(usable & set(r.placement[0].gpus))
            if r.state in LEAVING:
                freeable += gained  # on its way out, whoever's it is
            elif r.model == waiting.name:
                continue  # it serves the waiting model: it stays
            elif specs[r.model].priority > waiting.priority:
                continue
            else:
                by_model[r.model].append(gained)
        for name, gains in by_model.items():
            freeable += sum(sorted(gains, reverse=True)[: may_lose[name]])
        if freeable >= waiting.gpus_per_replica:
            return True
    return False


@settings(max_examples=400, deadline=None)
@given(fleets())
def test_final_only_when_no_node_could_ever_hold_it(fleet):
    waiting, inputs = fleet
    plan = plan_room(waiting, inputs)
    if plan.placement is not None:
        assert could_ever_fit(waiting, inputs)
        return
    assert plan.final == (not could_ever_fit(waiting, inputs)), (plan.final, plan.reason)

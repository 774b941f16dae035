"""Loading and unloading adapters as a pure step, over random replicas, adapters, uses and
requests: never an unload of an adapter in use, of unknown use, wanted, young or kept by
min_loaded; never more adapters on a replica than its base allows; never a load where it failed.
The rules are written out here, not asked of the code."""

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.rules.adapters import Adapter, AdapterInputs, held, plan_adapters, slot_id
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import ModelSpec, Replica, ReplicaState, Slice


@st.composite
def fleets(draw):
    cap = draw(st.integers(1, 3))
    base = ModelSpec(name="b", gpu_class="H100-80GB", command=["x"], max_adapters=cap)
    names = [f"a{i}" for i in range(draw(st.integers(1, 8)))]
    adapters = {
        n: Adapter(
            n,
            "b",
            f"s3://{n}",
            priority=draw(st.integers(0, 2)),
            idle_after_s=draw(st.sampled_from([60.0, 600.0])),
            min_loaded=draw(st.sampled_from([0, 0, 1])),
        )
        for n in names
    }
    replicas, idle, in_flight = [], {}, {}
    for i in range(draw(st.integers(1, 4))):
        state = draw(st.sampled_from([ReplicaState.READY] * 4 + [ReplicaState.STARTING]))
        loaded = draw(st.lists(st.sampled_from(names), unique=True, max_size=cap))
        failed = draw(st.lists(st.sampled_from(names), unique=True, max_size=2))
        replica = Replica(
            f"b-{i}",
            "b",
            [Slice("n", [i])],
            state=state,
            want_adapters=list(loaded),
            adapters=list(loaded),
            adapter_failures={n: "HTTP 404" for n in failed if n not in loaded},
        )
        replicas.append(replica)
        for n in loaded:
            slot = slot_id(replica.id, n)
            kind = draw(st.sampled_from([IdleState.EXACT, IdleState.AT_LEAST, IdleState.UNKNOWN]))
            # The number never says "idle" for unknown use: the state does.
            idle[slot] = (draw(st.floats(0, 999)), kind)
            if draw(st.integers(0, 4)) == 0:
                in_flight[slot] = 1
    waiting = {n: draw(st.integers(0, 3)) for n in names if draw(st.booleans())}
    return AdapterInputs(adapters, {"b": base}, replicas, waiting, idle, in_flight)


@settings(max_examples=1000, deadline=None)
@given(fleets())
def test_unloads_are_of_idle_known_unwanted_adapters_and_loads_fit(inputs):
    plan = plan_adapters(inputs)
    cap = inputs.specs["b"].max_adapters
    holders = {}
    for r in inputs.replicas:
        if r.state == ReplicaState.READY:
            for n in r.want_adapters:
                holders[n] = holders.get(n, 0) + 1
    for name, replica, _ in plan.unloads:
        adapter = inputs.adapters[name]
        seconds, state = inputs.idle[slot_id(replica.id, name)]
        assert state != IdleState.UNKNOWN
        assert seconds >= adapter.idle_after_s
        assert not inputs.in_flight.get(slot_id(replica.id, name))
        assert not inputs.waiting.get(name)
        assert holders[name] > adapter.min_loaded
    loads_on: dict[str, int] = {}
    for name, replica in plan.loads:
        assert replica.state == ReplicaState.READY
        assert name not in replica.adapter_failures, "never again where it failed"
        assert name not in replica.want_adapters
        loads_on[replica.id] = loads_on.get(replica.id, 0) + 1
    for r in inputs.replicas:
        assert len(held(r)) + loads_on.get(r.id, 0) <= max(cap, len(held(r))), "within the cap"
    for name, replica, _ in plan.unloads:
        assert not any(n == name and r.id == replica.id for n, r in plan.loads)

"""LoRA adapters, tick by tick: loaded where requests wait for them, routed only to replicas that
hold them, unloaded through the safe stop when their base's replicas are full, never while in
use or of unknown use; a failed load is shown and not retried; bad input changes nothing."""

import orjson
import pytest

from controlplane.rules.adapters import slot_id
from controlplane.state.fleet import BadRequest, Conflict
from controlplane.state.routetable import resolver_endpoints
from controlplane.vocabulary.model import ReplicaState
from tests.controlplane.conftest import ReportingRouter, make_node, spec


def base(**kw):
    return spec(name="llama", replicas=2, max_adapters=2, **kw)


def adapter(name, **kw):
    return {"kind": "adapter", "name": name, "base": "llama", "source": f"/loras/{name}", **kw}


def engines_obey(fleet, failing=()):
    """The node's engines hold exactly the adapters assigned, but those in `failing`."""
    reports = {}
    for i, a in enumerate(fleet.assignments("n1")):
        names = [x["name"] for x in a["adapters"]]
        reports[a["replica"]] = {
            "state": "Ready",
            "url": f"http://127.0.0.1:{9000 + i}",
            "adapters": [n for n in names if n not in failing],
            "adapter_failures": {n: "HTTP 404: No adapter found" for n in names if n in failing},
        }
    fleet.heartbeat("n1", {"replicas": reports})


@pytest.fixture
def served(make_fleet, clock):
    """llama on two replicas (2 adapters each), Ready, with a router watching them."""
    return ready_base(make_fleet, base())


def ready_base(make_fleet, body):
    fleet, reconciler = make_fleet()
    fleet.register(make_node("n1", gpus=2))
    fleet.apply(body)
    reconciler.tick()
    engines_obey(fleet)
    reconciler.tick()
    router = ReportingRouter(fleet, reconciler)
    router.report()
    return fleet, reconciler, router


def holders(fleet, name):
    return sorted(r.id for r in fleet.replicas.values() if name in r.want_adapters)


def test_an_adapter_is_loaded_where_requests_wait_and_routed_only_there(served):
    fleet, reconciler, router = served
    fleet.apply_adapter(adapter("sql"))
    reconciler.tick()
    assert holders(fleet, "sql") == [], "nothing asked for it: nothing loaded"
    assert reconciler.routes.routes["sql"] == [], "known: its requests wait, not 404"
    router.report(waiting={"sql": 3})
    reconciler.tick()
    (holder,) = holders(fleet, "sql")
    assert reconciler.routes.routes["sql"] == [], "routed once its engine holds it"
    engines_obey(fleet)
    reconciler.tick()
    url = fleet.replicas[holder].url
    assert reconciler.routes.routes["sql"] == [{"id": slot_id(holder, "sql"), "url": url}]
    assert fleet.adapter_loads == {"sql": 1}


def test_the_least_loaded_replica_takes_the_next_adapter(served):
    fleet, reconciler, router = served
    for name in ("a1", "a2"):
        fleet.apply_adapter(adapter(name))
    router.report(waiting={"a1": 1, "a2": 1})
    reconciler.tick()
    assert holders(fleet, "a1") != holders(fleet, "a2"), "one on each replica"


def full(served, clock):
    """Both replicas hold two adapters each, all of them loaded and idle."""
    fleet, reconciler, router = served
    names = ["a1", "a2", "a3", "a4"]
    for name in names:
        fleet.apply_adapter(adapter(name, idle_after="1m"))
    router.report(waiting={n: 1 for n in names})
    reconciler.tick()
    engines_obey(fleet)
    reconciler.tick()
    router.report()
    return names


def tick_for(fleet, reconciler, router, clock, seconds, **report):
    clock.advance(seconds)
    fleet.heartbeat("n1", {})
    engines_obey(fleet)
    router.report(**report)
    reconciler.tick()


def test_when_full_the_adapter_idle_longest_past_idle_after_is_unloaded_safely(served, clock):
    fleet, reconciler, router = served
    full(served, clock)
    fleet.apply_adapter(adapter("new"))
    slot = slot_id(holders(fleet, "a1")[0], "a1")
    tick_for(fleet, reconciler, router, clock, 30, used={slot: 0.0}, waiting={"new": 1})
    assert fleet.adapter_reasons["new"].startswith("every replica of llama holds 2 adapters")
    assert "idle 30s of its 1m" in fleet.adapter_reasons["new"]
    tick_for(fleet, reconciler, router, clock, 40, waiting={"new": 1})
    (victim,) = [n for n in ("a2", "a3", "a4") if not holders(fleet, n)]
    assert holders(fleet, "a1"), "used 40 s ago: kept"
    victim_replica = next(r for r in fleet.replicas.values() if victim in r.unloading)
    assert victim in [a["name"] for a in fleet.assignments("n1")[0]["adapters"]] + [
        a["name"] for a in fleet.assignments("n1")[1]["adapters"]
    ], "the engine keeps it until the router has dropped its route"
    assert slot_id(victim_replica.id, victim) not in [
        e["id"] for e in reconciler.routes.routes[victim]
    ]
    tick_for(fleet, reconciler, router, clock, 1, waiting={"new": 1})
    assert victim not in victim_replica.unloading, "acked: the engine unloads it"
    tick_for(fleet, reconciler, router, clock, 1, waiting={"new": 1})
    assert holders(fleet, "new") == [victim_replica.id], "loaded where room was made"
    assert fleet.adapter_unloads[victim] == 1


def test_an_adapter_in_use_or_of_unknown_use_is_never_unloaded(served, clock):
    fleet, reconciler, router = served
    full(served, clock)
    fleet.apply_adapter(adapter("new"))
    in_flight = {slot_id(holders(fleet, n)[0], n): 1 for n in ("a1", "a2", "a3")}
    silent = ReportingRouter(fleet, reconciler, name="cut")
    silent.report()  # it has every slot in its table, then falls silent
    for _ in range(8):
        tick_for(fleet, reconciler, router, clock, 30, in_flight=in_flight, waiting={"new": 1})
    assert all(holders(fleet, n) for n in ("a1", "a2", "a3", "a4"))
    assert "use unknown" in fleet.adapter_reasons["new"]


def test_a_failed_load_is_shown_and_not_tried_again_there(served, clock):
    fleet, reconciler, router = served
    fleet.apply_adapter(adapter("broken"))
    router.report(waiting={"broken": 1})
    reconciler.tick()
    first = holders(fleet, "broken")
    engines_obey(fleet, failing={"broken"})
    assert holders(fleet, "broken") == []
    tick_for(fleet, reconciler, router, clock, 1, waiting={"broken": 1})
    second = holders(fleet, "broken")
    assert second and second != first, "tried on the other replica, not again on the first"
    engines_obey(fleet, failing={"broken"})
    for _ in range(3):
        tick_for(fleet, reconciler, router, clock, 1, waiting={"broken": 1})
    assert holders(fleet, "broken") == []
    assert fleet.adapter_loads["broken"] == 2, "no load in a loop"
    assert fleet.adapter_reasons["broken"].startswith("failed to load:")
    assert "No adapter found" in fleet.adapter_reasons["broken"]
    fleet.apply_adapter(adapter("broken", source="/loras/fixed"))
    tick_for(fleet, reconciler, router, clock, 1, waiting={"broken": 1})
    assert holders(fleet, "broken"), "applied again: tried again"


def loaded_once(served, name) -> str:
    """`name` applied, asked for, loaded on one replica and routed there: that replica."""
    fleet, reconciler, router = served
    fleet.apply_adapter(adapter(name))
    router.report(waiting={name: 1})
    reconciler.tick()
    engines_obey(fleet)
    reconciler.tick()
    (holder,) = holders(fleet, name)
    return holder


def test_a_deleted_adapter_is_unloaded_everywhere_through_the_safe_stop(served, clock):
    fleet, reconciler, router = served
    holder = loaded_once(served, "sql")
    fleet.delete_adapter("sql")
    reconciler.tick()
    assert "sql" not in reconciler.routes.routes
    assert list(fleet.replicas[holder].unloading) == ["sql"], "until the router acknowledges"
    assert "sql" in [a["name"] for a in fleet.assignments("n1")[0]["adapters"]] + [
        a["name"] for a in fleet.assignments("n1")[1]["adapters"]
    ]
    tick_for(fleet, reconciler, router, clock, 1)
    assert fleet.replicas[holder].unloading == {}
    engines_obey(fleet)
    assert fleet.replicas[holder].adapters == []


def test_a_use_of_an_adapter_is_a_use_of_its_replica(served, clock):
    fleet, reconciler, router = served
    holder = loaded_once(served, "sql")
    tick_for(fleet, reconciler, router, clock, 5, in_flight={slot_id(holder, "sql"): 2})
    assert fleet.idle.in_flight()[holder] == 2, "nothing stops or sleeps a replica in use"
    tick_for(fleet, reconciler, router, clock, 5, used={slot_id(holder, "sql"): 1.0})
    seconds, state = fleet.idle.idle_for(holder)
    assert str(state) == "exact" and seconds <= 1.0


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (adapter("x", base="nope"), "base", "no model 'nope'"),
        (adapter("llama"), "name", "a model is named llama"),
        (adapter("x", source=""), "source", "required"),
        (adapter("x", priority="high"), "priority", "integer"),
        (adapter("x", idle_after="soon"), "idle_after", "duration"),
        (adapter("x", min_loaded=-1), "min_loaded", "non-negative"),
        (adapter("x", shape="round"), "shape", "unknown field"),
        (adapter("Bad Name"), "name", "lower-case"),
    ],
)
def test_bad_adapters_are_refused_and_nothing_changes(served, body, field, message):
    fleet, _, _ = served
    fleet.apply_adapter(adapter("kept"))
    before = {n: a.to_dict() for n, a in fleet.adapters.items()}
    with pytest.raises(BadRequest) as refused:
        fleet.apply_adapter(body)
    assert refused.value.field == field and message in refused.value.message
    assert {n: a.to_dict() for n, a in fleet.adapters.items()} == before


def test_a_base_without_max_adapters_takes_none_and_names_stay_apart(make_fleet):
    fleet, _ = make_fleet()
    fleet.apply(spec(name="plain"))
    with pytest.raises(BadRequest, match="holds no adapters: give it max_adapters"):
        fleet.apply_adapter({**adapter("x"), "base": "plain"})
    fleet.apply(base())
    fleet.apply_adapter(adapter("sql"))
    with pytest.raises(BadRequest, match="an adapter is named sql"):
        fleet.apply(spec(name="sql"))
    with pytest.raises(Conflict, match="adapters use model llama as their base"):
        fleet.delete("llama")


def test_adapters_survive_a_restart(make_fleet, served):
    fleet, _, _ = served
    fleet.apply_adapter(adapter("sql", priority=3))
    reloaded, _ = make_fleet()
    assert reloaded.adapters["sql"].to_dict() == fleet.adapters["sql"].to_dict()
    _, outcome = reloaded.apply_adapter(adapter("sql", priority=3))
    assert outcome == "unchanged"


def test_the_ready_state_is_required_to_route(served):
    fleet, reconciler, router = served
    fleet.apply_adapter(adapter("sql"))
    router.report(waiting={"sql": 1})
    reconciler.tick()
    engines_obey(fleet)
    (holder,) = holders(fleet, "sql")
    fleet.set_replica_state(fleet.replicas[holder], ReplicaState.UNHEALTHY, "probe failing")
    reconciler.tick()
    assert reconciler.routes.routes["sql"] == []


def test_a_router_restart_never_makes_a_used_adapter_look_idle(served, clock):
    fleet, reconciler, router = served
    full(served, clock)
    fleet.apply_adapter(adapter("new"))
    slot = slot_id(holders(fleet, "a1")[0], "a1")
    tick_for(fleet, reconciler, router, clock, 50, used={slot: 0.0})
    # The router dies without a goodbye and comes back: a use may hide in the gap.
    clock.advance(30)
    fleet.heartbeat("n1", {})
    fleet.idle.report(
        {
            "router": "edge",
            "incarnation": "i2",
            "uptime_s": 1,
            "route_version": reconciler.routes.version,
            "used": {},
            "watched": {e["id"]: 1 for eps in reconciler.routes.routes.values() for e in eps},
            "in_flight": {},
            "waiting": {"new": 1},
        }
    )
    reconciler.tick()
    seconds, state = fleet.idle.idle_for(slot)
    assert str(state) == "at_least" and seconds < 60, "the bound restarts after the gap"
    assert holders(fleet, "a1"), "so it is not taken for new"


def test_an_adapter_changed_against_another_generation_is_refused(served):
    fleet, _, _ = served
    stored, _ = fleet.apply_adapter(adapter("sql"))
    fleet.apply_adapter(adapter("sql", priority=2))
    with pytest.raises(Conflict, match="adapter sql is at generation 2"):
        fleet.apply_adapter({**adapter("sql", priority=5), "generation": stored.generation})
    with pytest.raises(Conflict, match="does not exist any more"):
        fleet.apply_adapter({**adapter("gone"), "generation": 3})
    assert fleet.adapters["sql"].priority == 2 and "gone" not in fleet.adapters


def test_an_unload_under_way_is_waited_for_not_doubled(served, clock):
    """Room is being made for `new` and the unload waits for a request still in flight on
    the victim: later ticks wait for it too, rather than unload a second adapter elsewhere."""
    fleet, reconciler, router = served
    full(served, clock)
    fleet.apply_adapter(adapter("new"))
    tick_for(fleet, reconciler, router, clock, 70, waiting={"new": 1})
    (victim_replica,) = [r for r in fleet.replicas.values() if r.unloading]
    (victim,) = victim_replica.unloading
    busy = {slot_id(victim_replica.id, victim): 1}
    for _ in range(3):
        tick_for(fleet, reconciler, router, clock, 1, waiting={"new": 1}, in_flight=busy)
    assert sum(fleet.adapter_unloads.values()) == 1
    assert [r.id for r in fleet.replicas.values() if r.unloading] == [victim_replica.id]
    assert "waiting for an unload to finish" in fleet.adapter_reasons["new"]


def test_an_adapter_ordered_out_is_held_again_only_once_its_engine_says_so(served, clock):
    """Unloaded on a replica, then wanted there again before its engine's next report: no
    route to it until the engine reports it loaded anew (it may be gone already)."""
    fleet, reconciler, router = served
    full(served, clock)
    fleet.apply_adapter(adapter("new"))
    tick_for(fleet, reconciler, router, clock, 70, waiting={"new": 1})
    victim_replica = next(r for r in fleet.replicas.values() if r.unloading)
    (victim,) = victim_replica.unloading
    clock.advance(1)
    router.report(waiting={"new": 1})
    reconciler.tick()  # acked: the engine is told to unload it now
    assert victim not in victim_replica.unloading
    assert victim not in victim_replica.adapters, "not held as far as routes go"
    victim_replica.want_adapters.append(victim)  # wanted there again before any report
    reconciler.tick()
    slot = slot_id(victim_replica.id, victim)
    assert slot not in [e["id"] for e in reconciler.routes.routes[victim]]


@pytest.fixture
def resolving(make_fleet, clock):
    """llama on two replicas of 2 adapter slots whose engines load adapters themselves."""
    return ready_base(make_fleet, base(adapter_resolver=True))


def engine_loads(fleet, replica_id, *names):
    """The engine of `replica_id` loaded `names` on requests, besides what it was told to."""
    reports = {}
    for i, a in enumerate(fleet.assignments("n1")):
        held = [x["name"] for x in a["adapters"]]
        if a["replica"] == replica_id:
            held += [n for n in names if n not in held]
        reports[a["replica"]] = {
            "state": "Ready", "url": f"http://127.0.0.1:{9000 + i}", "adapters": held,
        }  # fmt: skip
    fleet.heartbeat("n1", {"replicas": reports})


def resolver_ids(published: dict, adapter: str) -> list[str]:
    return [e["id"] for e in resolver_endpoints(published, adapter)]


def test_a_resolving_base_publishes_its_free_slots_and_keeps_what_its_engines_load(resolving):
    fleet, reconciler, router = resolving
    for name in ("a1", "a2"):
        fleet.apply_adapter(adapter(name))
    reconciler.tick()
    first, second = sorted(fleet.replicas)
    table = reconciler.routes.as_json()
    assert table["adapters"] == ["a1", "a2"]
    assert resolver_ids(table["resolvers"], "a1") == [slot_id(first, "a1"), slot_id(second, "a1")]
    engine_loads(fleet, first, "a1")  # a router sent it a request for a1
    reconciler.tick()
    assert holders(fleet, "a1") == [first], "kept as if placed there"
    assert fleet.adapter_resolved["a1"] == 1 and fleet.adapter_loads.get("a1", 0) == 0
    assert [e["id"] for e in reconciler.routes.routes["a1"]] == [slot_id(first, "a1")]
    assert resolver_ids(reconciler.routes.resolvers, "a1") == [slot_id(second, "a1")]
    assert "a1" in [a["name"] for a in fleet.assignments("n1")[0]["adapters"]] + [
        a["name"] for a in fleet.assignments("n1")[1]["adapters"]
    ]
    engine_loads(fleet, first, "a1", "a2")
    reconciler.tick()
    assert resolver_ids(reconciler.routes.resolvers, "a2") == [slot_id(second, "a2")]
    assert resolver_ids(reconciler.routes.resolvers, "a1") == [slot_id(second, "a1")]


def test_the_resolvers_grow_with_adapters_plus_replicas_not_their_product(resolving):
    fleet, reconciler, router = resolving
    sizes = {}
    for count in (20, 200):
        for i in range(count):
            fleet.apply_adapter(adapter(f"x{i}"))
        reconciler.tick()
        (entry,) = reconciler.routes.as_json()["resolvers"].values()
        assert len(entry["adapters"]) == len(fleet.adapters) and len(entry["replicas"]) == 2
        assert all(len(r["taken"]) < 2 for r in entry["replicas"]), "within max_adapters"
        assert len(resolver_ids(reconciler.routes.resolvers, "x7")) == 2, "each replica, each"
        sizes[count] = len(orjson.dumps(entry))
    per_adapter = (sizes[200] - sizes[20]) / 180
    assert per_adapter < 10, f"{per_adapter:.1f} bytes per adapter: a name and its comma"


def test_a_base_without_a_resolver_publishes_none_and_adopts_nothing(served):
    fleet, reconciler, router = served
    fleet.apply_adapter(adapter("a1"))
    reconciler.tick()
    assert reconciler.routes.resolvers == {}
    engine_loads(fleet, sorted(fleet.replicas)[0], "a1")
    reconciler.tick()
    assert holders(fleet, "a1") == [] and not fleet.adapter_resolved.get("a1")


def test_a_full_resolving_replica_frees_a_slot_from_its_idlest_adapter_only(resolving, clock):
    fleet, reconciler, router = resolving
    for name in ("a1", "a2", "a3"):
        fleet.apply_adapter(adapter(name, idle_after="1m"))
    reconciler.tick()
    first = sorted(fleet.replicas)[0]
    engine_loads(fleet, first, "a1", "a2")
    reconciler.tick()
    assert holders(fleet, "a1") == holders(fleet, "a2") == [first]
    a1 = slot_id(first, "a1")
    tick_for(fleet, reconciler, router, clock, 30, used={a1: 0.0})
    assert not fleet.replicas[first].unloading, "nothing idle past its idle_after yet"
    assert slot_id(first, "a3") not in resolver_ids(reconciler.routes.resolvers, "a3")
    tick_for(fleet, reconciler, router, clock, 40, in_flight={a1: 1})
    assert not fleet.replicas[first].unloading, "a2 idle 40 s of its minute"
    tick_for(fleet, reconciler, router, clock, 30, in_flight={a1: 1})
    assert list(fleet.replicas[first].unloading) == ["a2"], "the idle one, not the busy one"
    assert fleet.adapter_unloads["a2"] == 1
    tick_for(fleet, reconciler, router, clock, 1)
    tick_for(fleet, reconciler, router, clock, 1)
    assert holders(fleet, "a1") == [first] and not holders(fleet, "a2")
    assert slot_id(first, "a3") in resolver_ids(reconciler.routes.resolvers, "a3")


def test_a_router_reported_resolver_failure_keeps_the_adapter_off_resolvers_until_reapplied(
    resolving,
):
    fleet, reconciler, router = resolving
    fleet.apply_adapter(adapter("a1"))
    reconciler.tick()
    first = sorted(fleet.replicas)[0]
    fleet.take_resolve_failures({slot_id(first, "a1"): "HTTP 404", "nobody@a1": "x", 3: 4})
    fleet.take_resolve_failures("not a map")
    reconciler.tick()
    assert "a1" in fleet.replicas[first].adapter_failures
    waits = "its requests wait for the control plane"
    assert resolver_ids(reconciler.routes.resolvers, "a1") == [], waits
    router.report(waiting={"a1": 1})
    reconciler.tick()
    assert holders(fleet, "a1") == [sorted(fleet.replicas)[1]], "placed, never where it failed"
    fleet.apply_adapter(adapter("a1", idle_after="5m"))
    engines_obey(fleet)
    reconciler.tick()
    assert "a1" not in fleet.replicas[first].adapter_failures, "applied again: tried again"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_adapter_resolver_must_be_a_boolean_with_max_adapters(make_fleet, value):
    fleet, _ = make_fleet()
    with pytest.raises(BadRequest, match="adapter_resolver"):
        fleet.apply(spec(name="llama", adapter_resolver=value, max_adapters=2))
    with pytest.raises(BadRequest, match="needs max_adapters"):
        fleet.apply(spec(name="llama", adapter_resolver=True))
    assert "llama" not in fleet.specs

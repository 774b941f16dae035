"""A router's resolvers (router/control/resolvers.py): one hidden route per base whose engines load
adapters themselves, the replicas that hold an adapter or are busy with it left out for it,
and a failed adapter given up until the next table."""

from router.control.resolvers import Resolvers, checked_resolvers, served, with_resolvers

PUBLISHED = {
    "llama": {
        "adapters": ["a1", "a2"],
        "replicas": [
            {"id": "r1", "url": "http://127.0.0.1:9001", "taken": ["a1"]},
            {"id": "r2", "url": "http://127.0.0.1:9002", "taken": []},
        ],
    },
    "gone": {"adapters": ["z"], "replicas": [{"id": "r9", "url": "http://127.0.0.1:9009"}]},
    "bad": {"adapters": "not a list of names", "replicas": [{"url": "no id"}]},
}
ROUTES = {
    "llama": [{"id": "r1", "url": "http://127.0.0.1:9001"}, {"id": "r2", "url": "http://127.0.0.1:9002"}],
    "a1": [{"id": "r1@a1", "url": "http://127.0.0.1:9001"}],
    "a2": [],
}


def table_of(fastpath, version: int):
    resolvers = Resolvers()
    resolvers.published = checked_resolvers(PUBLISHED)
    table = fastpath.EndpointTable()
    merged = with_resolvers(ROUTES, resolvers.published)
    table.update({m: [(e["id"], e["url"]) for e in eps] for m, eps in merged.items()}, version)
    resolvers.update(table)
    return table, resolvers


def test_one_route_per_base_holds_its_free_replicas_and_no_client_sees_it(fastpath):
    table, resolvers = table_of(fastpath, 5)
    assert set(resolvers.published) == {"llama", "gone"}, "a malformed entry is left out"
    assert [e[1] for e in table.endpoints("llama@resolver")] == ["r1", "r2"]
    assert "gone@resolver" not in table.models(), "no route for a base the table lacks"
    assert served(table.models()) == ["llama", "a1", "a2"]
    assert resolvers.route_of("a1") == resolvers.route_of("a2") == "llama@resolver"
    assert resolvers.route_of("z") is None and resolvers.adapters == {"a1", "a2"}


def test_an_adapter_is_never_resolved_where_it_is_held_or_busy(fastpath):
    table, resolvers = table_of(fastpath, 5)
    slots = [table.acquire("llama@resolver", 0, resolvers.taken.get("a1", ())) for _ in range(6)]
    assert {table.endpoint_id(slot) for slot in slots} == {"r2"}, "r1 holds a1"
    for slot in slots:
        table.release(slot)
    slots = [table.acquire("llama@resolver", 0, resolvers.taken.get("a2", ())) for _ in range(6)]
    assert {table.endpoint_id(slot) for slot in slots} == {"r1", "r2"}, "the least loaded"


def test_a_failed_adapter_is_given_up_until_the_next_table(fastpath):
    table, resolvers = table_of(fastpath, 5)
    resolvers.failed("a2", "r2", 404)
    assert resolvers.failures == {"r2@a2": "HTTP 404"}, "named as the control plane names it"
    resolvers.update(table)  # the next tick, same table
    assert resolvers.route_of("a2") is None and resolvers.route_of("a1") == "llama@resolver"
    table.update({m: [(e["id"], e["url"]) for e in eps] for m, eps in ROUTES.items()}, 6)
    resolvers.update(table)
    assert resolvers.route_of("a1") is None, "a table without its base's resolver route"
    table.update(
        {
            m: [(e["id"], e["url"]) for e in eps]
            for m, eps in with_resolvers(ROUTES, resolvers.published).items()
        },
        7,
    )
    resolvers.update(table)
    assert resolvers.route_of("a2") == "llama@resolver", "tried again on a new table"


def test_a_replica_in_two_routes_reports_its_latest_use(fastpath):
    table, resolvers = table_of(fastpath, 5)
    base_slots = {endpoint_id: slot for slot, endpoint_id, _ in table.endpoints("llama")}
    resolver_slots = {e: slot for slot, e, _ in table.endpoints("llama@resolver")}
    table._pin_clock(100.0)
    table.release(table.acquire("llama", 0, (base_slots["r2"],)))  # r1 for llama
    table._pin_clock(130.0)
    slot = table.acquire("llama@resolver", 0, (resolver_slots["r2"],))  # r1 for a2
    assert table.endpoint_id(slot) == "r1"
    table._pin_clock(135.0)
    snapshot = table.snapshot()
    assert snapshot["in_flight"] == {"r1": 1} and snapshot["used"]["r1"] == 0.0
    table.release(slot)
    table._pin_clock(140.0)
    snapshot = table.snapshot()
    assert snapshot["used"] == {"r1": 5.0}, "its latest use, by either route"
    assert set(snapshot["watched"]) == {"r1", "r2", "r1@a1"}

"""The router's tenant rules in isolation: buckets, shares, the fair queue, usage parsing."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.rules.tenantshares import FLOOR_SHARE, by_demand, split
from router.path.fairqueue import FairQueue
from router.protocol.wire import number_after, usage_tokens
from router.tenancy.tenants import (
    ADMITTED,
    BAD_BOUND,
    COMPLETION_TOKENS,
    NO_BOUND,
    OVER_IN_FLIGHT,
    OVER_REQUESTS,
    OVER_TOKENS,
    PROMPT_TOKENS,
    TenantBook,
    TenantState,
    completion_bound,
    tokens_asked,
)


def limited(now=0.0, **rules):
    """A tenant whose whole limits are this router's share (a router alone)."""
    tenant = TenantState("t", now)
    names = ("requests_per_minute", "tokens_per_minute", "max_in_flight")
    tenant.configure(rules, [rules.get(name) for name in names], FLOOR_SHARE, 1)
    return tenant


def test_requests_are_admitted_at_the_share_and_refused_beyond():
    tenant = TenantState("t", 0.0)
    tenant.configure({"requests_per_minute": 600}, [60.0, None, None], FLOOR_SHARE, 3)
    admitted = sum(tenant.admit(60.0, 0, True) == ADMITTED for _ in range(100))
    assert admitted == 60, "a minute of the share at once once it filled, no more"
    assert tenant.admit(60.0, 0, True) == OVER_REQUESTS
    assert 0.9 <= tenant.retry_after(OVER_REQUESTS) <= 1.1  # one request a second
    assert tenant.admit(61.01, 0, True) == ADMITTED


def test_a_named_router_starts_with_a_second_of_its_share_not_a_minute():
    """A router restarted in a loop must not hand out a whole minute's share each time."""
    tenant = TenantState("t", 0.0)
    tenant.configure({"requests_per_minute": 6000}, [6000.0, None, None], FLOOR_SHARE, 1)
    assert sum(tenant.admit(0.0, 0, True) == ADMITTED for _ in range(1000)) == 100, "a second"
    big = TenantState("t", 0.0)
    big.configure({"requests_per_minute": 600_000}, [600_000.0, None, None], FLOOR_SHARE, 1)
    assert sum(big.admit(0.0, 0, True) == ADMITTED for _ in range(20_000)) == 10_000
    tokens = limited(tokens_per_minute=60_000)
    taken = [tokens.admit(0.0, 600, True) for _ in range(3)]
    assert taken == [ADMITTED, ADMITTED, OVER_TOKENS], "a second of 60,000: 1,000"
    slow = TenantState("t", 0.0)
    slow.configure({"requests_per_minute": 2}, [0.5, None, None], FLOOR_SHARE, 4)
    assert slow.admit(0.0, 0, True) == ADMITTED, "a share under one a minute still admits one"
    assert slow.admit(60.0, 0, True) == OVER_REQUESTS
    assert slow.admit(120.0, 0, True) == ADMITTED


def test_routers_not_named_share_what_is_kept_aside_however_many_begin_at_once():
    """The part of a limit kept aside (FLOOR_SHARE) split over every router heard: sixteen
    routers new to a tenant admit together no more than it, where each admitted 2% before."""
    routers = 16
    newcomers = []
    for _ in range(routers):
        tenant = TenantState("t", 0.0)
        tenant.configure({"tokens_per_minute": 6000}, None, FLOOR_SHARE, 1, routers)
        newcomers.append(tenant)
    taken = sum(
        1 for tenant in newcomers for _ in range(100) if tenant.admit(0.0, 1, True) == ADMITTED
    )
    assert taken <= 6000 * FLOOR_SHARE + routers, "within what is kept aside, give or take one"
    assert all(tenant.may_wait(OVER_TOKENS) for tenant in newcomers), "they wait to be named"
    few = TenantState("t", 0.0)
    few.configure({"requests_per_minute": 600}, None, FLOOR_SHARE, 1, routers)
    assert few.admit(0.0, 0, True) == OVER_REQUESTS, "under one request: none until named"


def test_routers_not_named_admit_nothing_at_once_however_few_the_table_counted():
    """Sixteen routers begin at once while the table counted one: each waits to be named,
    where a minute of the floor each would have let through 16 x what is kept aside."""
    newcomers = []
    for _ in range(16):
        tenant = TenantState("t", 0.0)
        tenant.configure({"requests_per_minute": 6000, "tokens_per_minute": 60000}, None,
                         FLOOR_SHARE, 1, 1)  # fmt: skip
        newcomers.append(tenant)
    assert all(tenant.admit(0.0, 1, True) == OVER_REQUESTS for tenant in newcomers)
    assert all(tenant.may_wait(OVER_REQUESTS) for tenant in newcomers), "they wait"
    named = newcomers[0]
    named.configure({"requests_per_minute": 6000, "tokens_per_minute": 60000},
                    [120.0, 1200.0, None], FLOOR_SHARE, 1, 1)  # fmt: skip
    admitted = [named.admit(0.0, 1, True) for _ in range(3)]
    assert admitted == [ADMITTED, ADMITTED, OVER_REQUESTS], "named: a second of its share"
    alone = TenantState("t", 0.0)
    alone.configure({"requests_per_minute": 6000}, None, FLOOR_SHARE, 1)  # no control plane
    assert alone.admit(0.0, 0, True) == ADMITTED, "without one, the floor's minute"


def test_a_named_router_waits_on_a_rate_only_while_the_fleet_has_room():
    tenant = TenantState("t", 0.0)
    rules = {"requests_per_minute": 600, "tokens_per_minute": 6000, "spare": [True, False]}
    tenant.configure(rules, [200.0, 2000.0, None], FLOOR_SHARE, 3, 3)
    assert tenant.may_wait(OVER_REQUESTS) and not tenant.may_wait(OVER_TOKENS)
    assert tenant.may_wait(OVER_IN_FLIGHT), "max_in_flight is dealt on demand"
    tenant.configure({**rules, "spare": [False, False]}, [200.0, 2000.0, None], FLOOR_SHARE, 3)
    assert not tenant.may_wait(OVER_REQUESTS), "the limit is reached fleet-wide: 429"


def test_a_lapsed_lease_falls_to_the_floor():
    tenant = TenantState("t", 0.0)
    tenant.configure({"requests_per_minute": 6000}, [3000.0, None, None], FLOOR_SHARE, 2, 4)
    tenant.requests.level = 0.0
    assert tenant.admit(1.0, 0, True) == ADMITTED  # 50 a second under the share
    tenant.requests.level = 0.0
    tenant.admit(2.0, 0, False)
    assert tenant.requests.per_minute == 6000 * FLOOR_SHARE / 4, "its part of what is aside"


def test_tokens_are_taken_whole_and_settled_from_the_engines_usage():
    tenant = limited(tokens_per_minute=1000)
    assert tenant.admit(60.0, 900, True) == ADMITTED
    assert tenant.admit(60.0, 900, True) == ADMITTED  # the bucket was above zero
    assert tenant.admit(60.0, 10, True) == OVER_TOKENS
    tenant.settle(900, 100)  # used far less than estimated: 800 back, to zero
    assert tenant.admit(60.0, 10, True) == OVER_TOKENS
    tenant.settle(900, 100)
    assert tenant.admit(60.0, 10, True) == ADMITTED
    assert tenant.in_flight == 1


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="each router's bucket may go one request past its share (taken whole once above"
    " zero): the excess grows with routers. Taken only where the bucket holds the estimate,"
    " the tokens bench at sixteen routers admitted 80% of the limit (4,830 of 6,000 a minute)",
)
@given(st.integers(2, 64), st.integers(1, 4000))
def test_no_number_of_routers_admits_more_tokens_than_their_shares_and_starts(routers, asked):
    """Each of `routers` flooded with requests of `asked` tokens for a minute: together they
    take at most the limit and the second of share each starts with."""
    limit = 6000.0
    fleet = []
    for _ in range(routers):
        tenant = TenantState("t", 0.0)
        tenant.configure({"tokens_per_minute": limit}, [None, limit / routers, None],
                         FLOOR_SHARE, routers)  # fmt: skip
        fleet.append(tenant)
    taken = 0.0
    for step in range(601):  # every 0.1 s for a minute, each router asked until it refuses
        for tenant in fleet:
            while tenant.admit(step / 10.0, asked, True) == ADMITTED:
                taken += asked
    past_a_whole_share = max(0.0, asked - limit / routers) * routers
    assert taken <= limit + limit / 60.0 + past_a_whole_share, (taken, routers, asked)


def test_in_flight_is_held_to_the_share():
    tenant = TenantState("t", 0.0)
    tenant.configure({"max_in_flight": 10}, [None, None, 2.0], FLOOR_SHARE, 5)
    assert [tenant.admit(0.0, 0, True) for _ in range(3)] == [
        ADMITTED,
        ADMITTED,
        OVER_IN_FLIGHT,
    ]
    tenant.settle(0, 0)
    assert tenant.admit(0.0, 0, True) == ADMITTED


def test_estimates_and_usage_are_read_from_the_bytes():
    body = b'{"model":"m","max_tokens": 50,"messages":[]}'
    assert tokens_asked(len(body), 50) == len(body) // 4 + 50
    tail = b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34}}\n\n'
    assert number_after(tail, PROMPT_TOKENS) == 12
    assert number_after(tail, COMPLETION_TOKENS) == 34
    assert number_after(b'{"usage": null}', PROMPT_TOKENS) == -1
    assert number_after(b'"prompt_tokens": 99999999999999999999', PROMPT_TOKENS) == -1
    assert usage_tokens(tail) == 12 << 32 | 34
    assert usage_tokens(b'{"usage":{"prompt_tokens":12}}') == -1, "both, or neither"
    assert usage_tokens(b'{"prompt_tokens":2147483648,"completion_tokens":1}') == -1


def test_the_ratelimit_lines_are_said_again_while_their_numbers_stay():
    tenant = limited(requests_per_minute=600, tokens_per_minute=6000)
    tenant.requests.level, tenant.tokens.level = 600, 6000  # full: a minute known
    assert tenant.admit(100.0, 10, True) == ADMITTED
    first = tenant.limit_headers()
    assert b"x-ratelimit-remaining-requests: 599\r\n" in first
    assert b"x-ratelimit-remaining-tokens: 5990\r\n" in first
    tenant.settle(10, 10)
    assert tenant.admit(101.0, 10, True) == ADMITTED  # a second later: full again, then taken
    assert tenant.limit_headers() is first
    assert tenant.admit(101.0, 10, True) == ADMITTED  # no time to fill: the numbers move
    moved = tenant.limit_headers()
    assert b"x-ratelimit-remaining-requests: 598\r\n" in moved
    assert b"x-ratelimit-remaining-tokens: 5980\r\n" in moved
    tenant.configure(
        {"requests_per_minute": 60}, [60.0, None, None], FLOOR_SHARE, 1
    )  # new limits: new lines, whatever the numbers
    assert b"x-ratelimit-limit-requests: 60\r\n" in tenant.limit_headers()


def test_the_book_finds_a_key_by_its_digest_and_refuses_the_rest():
    import hashlib

    book = TenantBook()
    digest = hashlib.sha256(b"secret").hexdigest()
    book.update(
        {"tenants": {"a": {"requests_per_minute": 10}}, "keys": {digest: ["a", "key-1"]}},
        "r1",
        0.0,
    )
    assert book.find(b"Bearer secret").name == "a"
    assert book.find(b"Bearer secret ").name == "a"
    assert book.take_keys_used().keys() == {"key-1"} and not book.take_keys_used()
    assert book.find(b"Bearer secret ").name == "a", "the header of the request before"
    assert book.take_keys_used().keys() == {"key-1"}, "used again after the last report"
    for bad in (None, b"", b"secret", b"Bearer other", b"Bearer " + b"s" * 20_000):
        assert book.find(bad) is None
    kept = book.tenants["a"]
    book.update({"tenants": {"a": {"requests_per_minute": 20}}, "keys": {}}, "r1", 1.0)
    assert book.tenants["a"] is kept, "a tenant kept keeps its buckets"
    assert book.find(b"Bearer secret") is None
    assert book.enabled()


def test_ten_thousand_bad_keys_leave_nothing_behind_and_good_ones_are_remembered_up_to_a_bound():
    """Only headers that name a key are remembered (MAX_KNOWN of them, each at most
    MAX_AUTHORIZATION bytes: at most about 100 MiB, reached only by that many real keys)."""
    import hashlib

    from router.tenancy.tenants import MAX_AUTHORIZATION, MAX_KNOWN

    book = TenantBook()
    keys = {hashlib.sha256(b"k%d" % i).hexdigest(): ["a", f"key-{i}"] for i in range(3)}
    book.update({"tenants": {"a": {}}, "keys": keys}, "r1", 0.0)
    for i in range(10_000):
        assert book.find(b"Bearer bad-%d" % i) is None
    assert book.known == {} and book.keys_used == set()
    assert all(book.find(b"Bearer k%d" % i).name == "a" for i in range(3))
    assert len(book.known) == 3
    assert MAX_KNOWN * MAX_AUTHORIZATION <= 110 * 2**20


def test_weights_release_one_to_three_and_priority_goes_first():
    queue = FairQueue(bound=1000)
    for i in range(400):
        queue.push(("a", i), "a", 0, 1.0)
        queue.push(("b", i), "b", 0, 3.0)
    released = [queue.pop()[0] for _ in range(200)]
    assert abs(released.count("b") / released.count("a") - 3.0) < 0.1
    queue.push(("vip", 0), "vip", 5, 1.0)
    assert queue.pop() == ("vip", 0)
    assert queue.remove(("a", 399), "a") and not queue.remove(("a", 399), "a")


def test_a_full_tenant_queue_refuses_and_leaves_the_others_room():
    queue = FairQueue(bound=2)
    assert queue.push(1, "a", 0, 1.0) and queue.push(2, "a", 0, 1.0)
    assert not queue.push(3, "a", 0, 1.0)
    assert queue.push(4, "b", 0, 1.0)


@given(
    st.floats(1, 1e9),
    st.dictionaries(st.text(min_size=1, max_size=3), st.floats(0, 1e9), min_size=1, max_size=20),
)
def test_shares_add_up_to_the_limit_and_each_has_its_floor_as_far_as_it_asks(limit, demands):
    shares = split(limit, demands)
    assert set(shares) == set(demands)
    assert abs(sum(shares.values()) - limit) <= 1e-6 * limit
    floor = min(limit * FLOOR_SHARE, limit / len(demands))
    for router, share in shares.items():
        assert share >= min(floor, demands[router]) * (1 - 1e-9), "its floor, as far as it asks"


def test_a_router_that_asks_nothing_now_holds_no_floor_while_the_others_flood():
    demands = {f"w{i}": 0.0 for i in range(12)} | {"a": 9000.0, "b": 3000.0}
    shares = split(6000, demands)
    assert all(shares[f"w{i}"] == 0.0 for i in range(12)), shares
    assert abs(shares["a"] + shares["b"] - 6000) < 1e-6 and shares["a"] > 2 * shares["b"]


def test_shares_follow_demand_when_it_exceeds_the_limit():
    shares = split(600, {"r1": 4800, "r2": 600, "r3": 600})
    assert shares["r1"] > 5 * shares["r2"]
    assert by_demand(10, {"a": 2, "b": 3}) == {"a": 4.5, "b": 5.5}


def test_workers_on_one_port_split_a_tenants_file_limits(tmp_path):
    from router.tenancy.tenantsfile import read_tenants_file

    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  - name: a\n    requests_per_minute: 600\n    max_in_flight: 4\n")
    alone = read_tenants_file(str(path), "r", 1)["tenants"]["a"]["shares"]["r"]
    assert alone == [600, 0, 4]
    dealt = [
        read_tenants_file(str(path), "r", 8, w)["tenants"]["a"]["shares"]["r"] for w in range(8)
    ]
    assert [share[2] for share in dealt] == [1, 1, 1, 1, 0, 0, 0, 0], "4 in flight, 8 workers"
    none = TenantBook()
    none.update(read_tenants_file(str(path), "r-w7", 8, 7), "r-w7", 0.0)
    assert none.tenants["a"].admit(0.0, 0, True) == OVER_IN_FLIGHT
    book = TenantBook()
    book.update(read_tenants_file(str(path), "r-w0", 4), "r-w0", 0.0)
    tenant = book.tenants["a"]
    admitted = sum(tenant.admit(60.0, 0, True) == ADMITTED for _ in range(1000))
    assert admitted == 1, "a quarter of 4 in flight: one at a time per worker"
    tenant.settle(0, 0)
    assert sum(tenant.admit(60.0, 0, True) == ADMITTED for _ in range(1000)) == 1
    assert tenant.requests.level < 150, "a quarter of 600 a minute, less what was taken"


BOUNDS = [
    (b'{"model":"m","max_tokens":50}', 50),
    (b'{"model":"m","max_completion_tokens":8000,"max_tokens":1}', 8000),  # vLLM's order
    (b'{"model":"m","max_tokens":1,"max_completion_tokens":8000}', 8000),
    (b'{"model":"m","max_completion_tokens":null,"max_tokens":7}', 7),
    (b'{"model":"m","messages":[{"role":"user","max_tokens":9}]}', NO_BOUND),  # nested
    (b'{"model":"m"}', NO_BOUND),
    (b'{"model":"m","max_tokens":"50"}', BAD_BOUND),
    (b'{"model":"m","max_tokens":1.5}', BAD_BOUND),
    (b'{"model":"m","max_tokens":1e3}', BAD_BOUND),
    (b'{"model":"m","max_tokens":-5}', BAD_BOUND),
    (b'{"model":"m","max_tokens":true}', BAD_BOUND),
    (b'{"model":"m","max_tokens":1000000000000}', 10**12),  # refused later, as too large
]


@pytest.mark.parametrize(("body", "bound"), BOUNDS)
def test_a_requests_bound_is_its_top_level_max_completion_tokens_else_max_tokens(body, bound):
    import orjson

    from router.protocol import _bodyscan

    scanned = _bodyscan.scan_body(body)
    assert scanned is not None
    assert completion_bound(scanned) == bound, "read in C"
    assert completion_bound(orjson.loads(body)) == bound, "read from the parsed body"


@pytest.mark.parametrize("wire", ["extension", "twin"])
def test_the_default_bound_is_written_last_in_the_body_the_engine_gets(wire):
    import orjson

    from router.protocol import _wire, wire_py

    module = _wire if wire == "extension" else wire_py
    for body in (b'{"model":"m"}', b'{ "model": "m", "max_tokens": null } ', b"{}"):
        written = module.with_max_tokens(body, 256)
        assert orjson.loads(written)["max_tokens"] == 256, written
        assert {k: v for k, v in orjson.loads(written).items() if k != "max_tokens"} == {
            k: v for k, v in orjson.loads(body).items() if k != "max_tokens"
        }

"""Each tenant's limits split among the routers that asked for it: a limit's excess does not
grow with the routers that never did, and max_in_flight is split like the rates."""

from controlplane.rules.tenantshares import RESERVED_SHARE, TenantLedger, tenant_table
from router.tenancy.tenants import ADMITTED, OVER_IN_FLIGHT, TenantState


def report(ledger, router, now, asked=0.0, tokens=0.0, tenant="acme"):
    body = {"router": router, "incarnation": "i1"}
    counters = {tenant: {"demand": [asked, tokens], "usage": {}}} if asked else {}
    ledger.report(body, counters, now)


def routers_asking(count: int, idle: int) -> TenantLedger:
    """`count` routers asking for acme at 100 requests a minute each, `idle` that never do."""
    ledger = TenantLedger()
    for now, total in ((0.0, 0.0), (60.0, 100.0), (120.0, 200.0)):
        for i in range(count):
            report(ledger, f"busy-{i}", now, total or 0.001, total * 10)
        for i in range(idle):
            report(ledger, f"idle-{i}", now)
    return ledger


def test_a_router_that_never_asked_for_a_tenant_gets_no_share_of_it():
    for idle in (2, 15, 47):
        shares = routers_asking(1, idle).shares("acme", 600, None, None)
        assert list(shares) == ["busy-0"], "idle routers hold nothing of acme's limit"
        dealt = 600 * (1 - RESERVED_SHARE)  # the rest is kept aside for routers not named yet
        assert shares["busy-0"][0] == dealt, f"with {idle} idle routers the asker has it all"


def test_the_table_says_how_many_routers_share_what_is_kept_aside_and_whether_there_is_room():
    """Every router heard (asking or not) takes its part of what is kept aside when it is not
    named; `spare` says whether the askers together asked for less than was dealt."""
    from types import SimpleNamespace

    def table(asked_per_minute: float) -> dict:
        ledger = TenantLedger()
        for now in (0.0, 60.0, 120.0):
            report(ledger, "busy-0", now, asked_per_minute * now / 60.0 or 0.001)
            for i in range(3):
                report(ledger, f"idle-{i}", now)
        acme = SimpleNamespace(
            name="acme", models=[], requests_per_minute=600, tokens_per_minute=None,
            max_in_flight=None, weight=1.0, priority=0, default_max_tokens=256,
        )  # fmt: skip
        return tenant_table({"acme": acme}, {}, ledger)

    under, flooded = table(100.0), table(6000.0)
    assert under["routers"] == flooded["routers"] == 4
    assert under["tenants"]["acme"]["spare"] == [True, False], "100 of 600 a minute: room"
    assert flooded["tenants"]["acme"]["spare"] == [False, False], "10 times it: none"


def test_max_in_flight_is_split_among_the_routers_that_asked():
    shares = routers_asking(2, 3).shares("acme", None, None, 32)
    assert sorted(shares) == ["busy-0", "busy-1"]
    assert sum(share[2] for share in shares.values()) == 32
    assert all(share[2] >= 1 for share in shares.values())


def test_a_tenant_with_only_max_in_flight_holds_its_streams_through_one_router():
    """Two routers live, one asking: its requests get the whole max_in_flight, not 1."""
    ledger = routers_asking(1, 1)
    shares = ledger.shares("acme", None, None, 16)
    tenant = TenantState("acme", 0.0)
    tenant.configure({"max_in_flight": 16}, shares["busy-0"], 0.02, len(shares))
    assert [tenant.admit(0.0, 0, True) for _ in range(4)] == [ADMITTED] * 4
    while tenant.admit(0.0, 0, True) == ADMITTED:
        pass
    assert tenant.in_flight == 16 and tenant.admit(0.0, 0, True) == OVER_IN_FLIGHT


def usage_report(fleet, router, incarnation, requests):
    body = {"router": router, "incarnation": incarnation, "uptime_s": 100, "route_version": 0,
            "used": {}, "watched": {}, "in_flight": {}, "waiting": {}}  # fmt: skip
    counters = {"acme": {"demand": [requests, 0.0],
                         "usage": {"chat": [requests, 0, 0, 10 * requests, 0, 0]}}}  # fmt: skip
    fleet.idle.report(body)
    fleet.ledger.report(body, counters, fleet.wall())
    fleet.flush_activity()


def requests_counted(fleet) -> int:
    return sum(row["requests"] for row in fleet.ledger.usage(24 * 3600, fleet.wall()))


def test_usage_adds_deltas_across_a_new_leader_and_a_long_silence(make_fleet, clock):
    fleet, _ = make_fleet()
    usage_report(fleet, "edge", "i1", 1000)  # a router's lifetime before this leader saw it
    assert requests_counted(fleet) == 1000, "a new incarnation counts from zero"
    usage_report(fleet, "edge", "i1", 1010)
    assert requests_counted(fleet) == 1010
    successor, _ = make_fleet()  # a new leader loads the store
    usage_report(successor, "edge", "i1", 1015)
    assert requests_counted(successor) == 1015, "5 more, not the router's lifetime again"
    clock.advance(35)  # silent past the router lease
    usage_report(successor, "edge", "i1", 1020)
    assert requests_counted(successor) == 1020, "a silence adds what grew meanwhile, no more"
    usage_report(successor, "edge", "i2", 3)  # restarted: its counters start again
    assert requests_counted(successor) == 1023


def test_max_in_flight_is_split_max_min_fair_by_the_concurrency_each_router_wanted():
    from controlplane.rules.tenantshares import split_fair

    assert split_fair(32, {"a": 2, "b": None, "c": None}) == {"a": 2, "b": 15, "c": 15}
    assert split_fair(32, {"a": 3, "b": 5, "c": 4}) == {"a": 10, "b": 12, "c": 10}, "spare spread"
    assert sum(split_fair(32, {f"r{i}": None for i in range(16)}).values()) == 32
    crowded = split_fair(4, {f"r{i}": None for i in range(16)})
    assert sorted(crowded.values()) == [0] * 12 + [1] * 4, "never more than the limit in all"
    assert split_fair(2, {"idle": 1, "busy": 3, "busier": 5}) == {"busier": 1, "busy": 1,
                                                                  "idle": 0}  # fmt: skip


def wanting(ledger, router, now, asked, wanted, version=-1, held=None):
    """A report: `asked` requests so far, `wanted` at once, `held` in flight (None: an older
    router's report, which does not say), holding route table `version`."""
    body = {"router": router, "incarnation": "i1", "route_version": version}
    counts = {"demand": [asked, 0.0], "wanted": wanted, "held": held, "usage": {}}
    ledger.report(body, {"acme": counts}, now)


def test_a_router_whose_clients_retry_refusals_at_once_does_not_take_the_others_slots():
    """r0's clients retry every refusal at once (a hundred times the requests); r1's hold 16
    streams. Both wanted more than they had: they end with half each, not r0 the most."""
    ledger = TenantLedger()
    given = {"r0": 1, "r1": 1}  # the fixed allowance, before the first table names them
    for step in range(8):
        now = step * 3.0
        # Each is saturated at what it was given and refused more: it wanted one more.
        wanting(ledger, "r0", now, 1 + step * 3000.0, given["r0"] + 1)
        wanting(ledger, "r1", now, 1 + step * 30.0, given["r1"] + 1)
        shares = ledger.shares("acme", None, None, 32)
        given = {r: s[2] for r, s in shares.items()}
    assert given == {"r0": 16, "r1": 16}


def test_shares_are_not_moved_by_reports_that_come_close_together():
    """Each new table makes every router report at once: a rate over a gap of milliseconds
    is noise, and a table a report would follow from it (16 routers: 80 tables a second)."""
    ledger = TenantLedger()
    wanting(ledger, "r0", 0.0, 1.0, 1)
    wanting(ledger, "r1", 0.0, 1.0, 1)
    first = ledger.shares("acme", 600, None, None)
    published = [first]
    asked = [1.0, 1.0]
    for step in range(1, 40):  # every 50 ms; r1 asks 300 a minute, r0 as much on average, in
        now = step * 0.05  # steps: one request in a gap, none in the next ("rates" 1,200 or 0)
        asked[0] += step % 2
        asked[1] += 0.25
        wanting(ledger, "r0", now, asked[0], 1)
        wanting(ledger, "r1", now, asked[1], 1)
        shares = ledger.shares("acme", 600, None, None)
        if shares is not published[-1]:
            published.append(shares)
    assert len(published) <= 1 + 2, f"{len(published)} tables in 2 s"


def test_a_share_grows_only_into_slots_the_others_no_longer_hold():
    """r0 held 24 of 32 and its clients left; r1 asks for more. r1 grows into what r0 no
    longer holds (it said it wanted 10 at most since), not at once to what r0 will give up;
    nor before r0 has said anything since its share was published."""
    from controlplane.rules.tenantshares import grown_into_free_slots

    # r0 was cut from 24 to 10 in the last table; r1, at 8, was refused (it wanted 9).
    old = {"r0": [None, None, 10], "r1": [None, None, 8]}
    fresh = {"r0": 10, "r1": 22}
    assert grown_into_free_slots(32, fresh, old, {"r0": 24, "r1": 9}) == {"r0": 10, "r1": 9}
    assert grown_into_free_slots(32, fresh, old, {"r0": 14, "r1": 9}) == {"r0": 10, "r1": 19}
    assert grown_into_free_slots(32, fresh, old, {"r0": 10, "r1": 9}) == fresh
    assert grown_into_free_slots(32, fresh, old, {"r0": 11, "r1": 9}) == fresh, "saturated at 10"
    # A router cut this time may still admit up to its old share.
    assert grown_into_free_slots(32, fresh, {"r0": [None, None, 24], "r1": [None, None, 8]},
                                 {"r0": 3, "r1": 9}) == {"r0": 10, "r1": 8}  # fmt: skip


def test_a_router_that_took_the_whole_limit_alone_is_not_assumed_drained_when_others_ask():
    """r0 asked first and was given all 32; r1 and r2 ask next, before r0 reports again. Its
    last report (2 wanted, from before its share) must not count as what it holds now."""
    ledger = TenantLedger()
    wanting(ledger, "r0", 0.0, 1.0, 2, held=0)
    first = ledger.shares("acme", None, None, 32)
    ledger.published_in(1)
    assert first["r0"][2] == 32
    wanting(ledger, "r1", 0.5, 1.0, 2, held=0)
    wanting(ledger, "r2", 0.5, 1.0, 2, held=0)
    shares = ledger.shares("acme", None, None, 32)
    ledger.published_in(2)  # the table that lowers r0
    assert shares["r1"][2] == shares["r2"][2] == 0, "no growth into r0's slots yet"
    wanting(ledger, "r0", 3.0, 100.0, 17, version=2, held=16)  # r0 has it, holds 16
    wanting(ledger, "r1", 3.0, 100.0, 2, version=2, held=0)
    wanting(ledger, "r2", 3.0, 100.0, 2, version=2, held=0)
    later = ledger.shares("acme", None, None, 32)
    held = {"r0": 16, "r1": 0, "r2": 0}
    grown = {r: later[r][2] for r in later}
    assert sum(max(grown[r], held[r]) for r in grown) <= 32, later
    assert grown["r1"] >= 1 and grown["r2"] >= 1, "they grow into what r0 is known not to hold"


def test_a_new_leader_publishes_the_shares_it_inherited_until_it_knows_the_rates(make_fleet, clock):
    """A failover must not drop every router to its floor: 16 each before, 16 each after."""
    fleet, _ = make_fleet()
    ledger = fleet.ledger
    for now, total in ((0.0, 0.0), (60.0, 100.0), (120.0, 200.0)):
        for router in ("edge-a", "edge-b", "edge-c", "edge-d"):
            report(ledger, router, clock() + now, total or 0.001, total * 10)
    before = ledger.shares("acme", 600, None, 64)
    assert [s[2] for s in before.values()] == [16] * 4
    fleet.flush_activity()
    successor, _ = make_fleet()
    assert successor.ledger.shares("acme", 600, None, 64) == before, "before any report"
    report(successor.ledger, "edge-a", clock() + 200, 300.0, 3000.0)
    report(successor.ledger, "edge-b", clock() + 200, 300.0, 3000.0)
    assert successor.ledger.shares("acme", 600, None, 64) == before, "one report: no rate yet"
    for now in (205.0, 210.0):
        for router in ("edge-a", "edge-b", "edge-c", "edge-d"):
            report(successor.ledger, router, clock() + now, 300.0 + now, 3000.0)
    after = successor.ledger.shares("acme", 600, None, 64)
    assert sorted(after) == sorted(before) and sum(s[2] for s in after.values()) == 64
    successor.ledger.forget_tenant("acme")
    successor.flush_activity()
    third, _ = make_fleet()
    assert third.ledger.shares("acme", 600, None, 64) == {}, "a deleted tenant's shares go"


def test_a_store_with_tenants_from_before_the_auth_setting_opens_closed(make_fleet):
    fleet, _ = make_fleet()
    fleet.apply_tenant({"name": "acme", "requests_per_minute": 60})
    fleet.store.put_record("setting/auth", None)  # as the previous version wrote it: no setting
    reopened, _ = make_fleet()
    assert reopened.auth_mode == "tenants"
    reopened.delete_tenant("acme")
    assert reopened.auth_mode == "tenants", "deleting the last tenant opens nothing"
    assert make_fleet()[0].auth_mode == "tenants", "and it is stored"


def test_a_share_another_router_gave_up_is_not_dealt_again_until_that_router_has_the_table():
    """edge-a held 2 of 2 and is lowered to 1; edge-b wants more. Until edge-a acknowledges the
    table that lowered it, it may still admit up to 2: edge-b gets nothing of that slot."""
    ledger = TenantLedger()

    def wants(router, now, held, version, waiting=0):
        wanting(ledger, router, now, 1.0 + now, held + waiting, version, held)

    wants("edge-a", 0.0, 2, 1)
    assert ledger.shares("acme", None, None, 2)["edge-a"][2] == 2
    ledger.published_in(2)
    wants("edge-a", 3.0, 1, 2)  # one of its two ended
    wants("edge-b", 3.0, 0, 2, waiting=3)  # three wait at edge-b
    shares = ledger.shares("acme", None, None, 2)
    ledger.published_in(3)
    assert shares["edge-a"][2] + shares["edge-b"][2] <= 2
    wants("edge-a", 6.0, 1, 2)  # edge-a still holds table 2: it may admit a second
    wants("edge-b", 6.0, 0, 3, waiting=3)
    later = ledger.shares("acme", None, None, 2)
    ledger.published_in(4)
    held_a = max(shares["edge-a"][2], 2)  # what edge-a may hold until it has table 3
    assert held_a + later["edge-b"][2] <= 2, (shares, later)
    wants("edge-a", 9.0, 1, 4)  # now it has the table that lowered it
    wants("edge-b", 9.0, 0, 4, waiting=3)
    final = ledger.shares("acme", None, None, 2)
    assert final["edge-a"][2] + final["edge-b"][2] == 2 and final["edge-b"][2] >= 1


def test_usage_over_any_window_is_the_sum_of_its_minutes_with_hours_summed_once():
    """Closed hours are added as sums made once; whatever the window, a clock set back into a
    summed hour, or minutes forgotten after a day, the rows are the minutes' plain sum."""
    import random

    from controlplane.rules.tenantshares import USAGE_KEPT_S

    draw = random.Random(7)
    ledger = TenantLedger()
    totals = {"r1": 0.0, "r2": 0.0}

    def send(router: str, now: float, tenant: str, model: str) -> None:
        totals[router] += draw.randint(1, 5)
        body = {"router": router, "incarnation": "i1"}
        usage = {model: [totals[router], 0.0, 0.0, 3.0, 5.0, 0.0]}
        ledger.report(body, {tenant: {"demand": [1.0, 1.0], "usage": usage}}, now)

    def naive(since_s: float, now: float) -> dict:
        sums: dict = {}
        for minute, bucket in ledger.minutes:
            if minute + 60.0 > now - since_s:
                for key, values in bucket.items():
                    sums[key] = sums.get(key, 0.0) + values[0]
        return sums

    def check(now: float) -> None:
        for since_s in (30.0, 600.0, 3600.0, 5000.0, 7 * 3600.0, USAGE_KEPT_S):
            rows = ledger.usage(since_s, now)
            got = {(r["tenant"], r["model"]): r["requests"] for r in rows}
            assert got == naive(since_s, now), f"window {since_s} s at {now}"

    now = 0.0
    for step in range(900):  # about 30 hours of reports, each router on one tenant's model
        now += draw.uniform(60.0, 180.0)
        send("r1" if step % 2 else "r2", now, draw.choice(["a", "b"]), draw.choice(["m1", "m2"]))
        if step % 97 == 0:
            check(now)
    send("r1", now - 7200.0, "a", "m1")  # a clock set back two hours: into a summed hour
    check(now)
    assert ledger.minutes[0][0] >= now - USAGE_KEPT_S - 60.0, "a day's minutes are kept"
    assert all(hour >= ledger.minutes[0][0] - 3600.0 for hour in ledger.hour_sums)

"""Each tenant's limits split among the routers that asked for it: a limit's excess does not
grow with the routers that never did, and max_in_flight is split like the rates."""

from controlplane.rules.tenantshares import TenantLedger
from router.tenants import ADMITTED, OVER_IN_FLIGHT, TenantState


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
        assert shares["busy-0"][0] == 600, f"with {idle} idle routers the asker has it all"


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

"""When a router reports between ticks: a new route version, and the end of the last
request on a replica that left its table (router/control/acks.py), over both tables."""

from router.control.acks import PromptAcks

BOTH = {"m": [("r1", "http://127.0.0.1:1"), ("r2", "http://127.0.0.1:2")]}
ONE = {"m": [("r1", "http://127.0.0.1:1")]}


def table_and_acks(fastpath):
    table = fastpath.EndpointTable()
    table.update(BOTH, version=1)
    acks = PromptAcks(table)
    acks.routes_changed()
    assert acks.due() and not acks.due(), "a new version is due once"
    return table, acks


def slot_of(table, endpoint_id):
    return next(slot for slot, eid, _ in table.endpoints("m") if eid == endpoint_id)


def test_a_replica_that_left_with_requests_on_it_is_reported_when_the_last_ends(fastpath):
    table, acks = table_and_acks(fastpath)
    r2 = slot_of(table, "r2")
    held = [table.acquire("m") for _ in range(4)]
    on_r2 = [slot for slot in held if slot == r2]
    assert len(on_r2) == 2
    table.update(ONE, version=2)
    acks.routes_changed()
    assert acks.due(), "the version without r2, at once"
    assert acks.watching and not acks.due(), "r2 still carries requests"
    table.release(on_r2[0])
    assert not acks.due()
    table.release(on_r2[1])
    assert acks.due(), "the last request on r2 ended"
    assert not acks.watching and not acks.due()


def test_a_replica_that_left_idle_or_came_back_is_not_followed(fastpath):
    table, acks = table_and_acks(fastpath)
    table.update(ONE, version=2)
    acks.routes_changed()
    assert acks.due() and not acks.watching, "nothing was on r2"
    held = table.acquire("m")
    table.update(BOTH, version=3)
    acks.routes_changed()
    table.update(ONE, version=4)
    acks.routes_changed()
    assert acks.due() and not acks.watching, "r2 left again, idle"
    table.release(held)
    assert not acks.due()

"""Operators' views: one computation per state shared by its readers, built off the loop."""

import asyncio
import threading

from controlplane.views.cache import Views
from controlplane.views.summary import summary
from tests.controlplane.conftest import make_node


def views_of(fleet, counters=lambda: (0,)):
    return Views(fleet, lambda: 0, counters)


def test_concurrent_readers_of_one_state_share_one_computation(make_fleet):
    fleet, _ = make_fleet()
    fleet.register(make_node("n1"))
    views = views_of(fleet)
    builds = []

    def build(snap):
        builds.append(threading.get_ident())
        return summary(snap)["nodes"]["total"]

    async def readers():
        return await asyncio.gather(*(views.get("summary", build) for _ in range(8)))

    assert asyncio.run(readers()) == [1] * 8
    assert len(builds) == 1 and views.built == 1


def test_a_change_of_state_is_seen_by_the_next_reader(make_fleet, clock):
    fleet, _ = make_fleet()
    fleet.register(make_node("n1"))
    ticks = [0]
    views = views_of(fleet, lambda: (ticks[0],))

    def total(snap):
        return summary(snap)["nodes"]["total"]

    async def read():
        return await views.get("nodes", total)

    assert asyncio.run(read()) == 1
    fleet.register(make_node("n2"))  # a change of the fleet's own state
    assert asyncio.run(read()) == 2
    built = views.built
    assert asyncio.run(read()) == 2 and views.built == built, "unchanged: served as it was"
    ticks[0] += 1  # a reconcile tick, a report: what the fleet's version does not count
    asyncio.run(read())
    assert views.built == built + 1
    clock.advance(views.max_age_s)  # and an unchanged fleet's idle times move on
    asyncio.run(read())
    assert views.built == built + 2


def test_a_view_is_built_off_the_loop_which_keeps_answering_meanwhile(make_fleet):
    fleet, _ = make_fleet()
    views = views_of(fleet)
    answered = threading.Event()
    where = {}

    def slow_build(snap):
        where["thread"] = threading.get_ident()
        # Built on the loop, this would wait for a coroutine that could never run.
        return answered.wait(timeout=10)

    async def main():
        where["loop"] = threading.get_ident()
        reading = asyncio.ensure_future(views.get("slow", slow_build))
        await asyncio.sleep(0.05)
        answered.set()  # what a heartbeat's handler would do while the view is built
        return await reading

    assert asyncio.run(main()) is True
    assert where["thread"] != where["loop"]


def test_a_view_that_failed_is_built_again_not_served_as_the_error(make_fleet):
    fleet, _ = make_fleet()
    views = views_of(fleet)
    calls = []

    def flaky(snap):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return "fine"

    async def read():
        try:
            return await views.get("flaky", flaky)
        except RuntimeError as exc:
            return str(exc)

    assert asyncio.run(read()) == "boom"
    assert asyncio.run(read()) == "fine"

"""The leader lease on a real PostgreSQL: one holder at a time, epochs that move on at each
takeover, a deadline that stops a leader by itself, and one clock (the database's) for what
leaders keep."""

import asyncio
import time

import pytest

from controlplane.server import Settings, begin_term
from controlplane.state.lease import RENEW, Lease
from controlplane.state.pgstore import FENCE, PostgresStore, connect_pool, migrate
from controlplane.vocabulary.idle import IdleState

HOUR = 3600.0
SETTINGS = Settings("127.0.0.1", 0, "postgresql://", {}, node_timeout_s=3600.0)


class Database:
    """A pool on a fresh database, and the event loop the test drives it with."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = self.run(connect_pool(dsn))
        self.run(migrate(self.pool))

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def fetchval(self, sql: str):
        return self.run(self.pool.fetchval(sql))

    def execute(self, sql: str):
        return self.run(self.pool.execute(sql))


@pytest.fixture
def db(postgres_dsn):
    made = Database(postgres_dsn)
    yield made
    made.run(made.pool.close())
    made.loop.close()


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def test_one_holder_at_a_time_and_each_takeover_moves_the_epoch(db):
    first = Lease(db.pool, "a", "http://a", ttl_s=1.0, renew_s=0.2)
    second = Lease(db.pool, "b", "http://b", ttl_s=1.0, renew_s=0.2)
    assert db.run(first.campaign()) == 1
    with pytest.raises(TimeoutError):  # a live lease is not taken
        db.run(asyncio.wait_for(second.campaign(), 0.6))
    assert second.leader_url == "http://a", "a standby knows whom to send callers to"
    db.run(first.release(1))
    assert db.run(second.campaign()) == 2, "a released lease is taken at once"
    assert db.fetchval("SELECT holder FROM leader_lease") == "b"


def test_a_leader_stops_at_its_deadline_without_hearing_it_lost(db):
    clock = Clock()
    lease = Lease(db.pool, "a", "http://a", ttl_s=2.0, renew_s=0.5, clock=clock)
    db.run(lease.campaign())
    assert lease.held
    clock.now += 1.2
    assert lease.held, "within the TTL less its margin (0.5 s)"
    clock.now += 0.4  # a pause (GC, SIGSTOP) past it
    assert not lease.held, "no renewal ran, and still it no longer leads"


def test_a_lost_lease_ends_the_hold_and_a_renewal_keeps_it(db):
    lease = Lease(db.pool, "a", "http://a", ttl_s=1.0, renew_s=0.2)
    db.run(lease.campaign())
    holding = db.run(asyncio.wait_for(hold_for(lease, 1.5), 5))
    assert holding, "renewed past its first TTL"
    db.run(lease.campaign())
    db.execute("UPDATE leader_lease SET epoch = epoch + 1, holder = 'b'")
    db.run(asyncio.wait_for(lease.hold(), 5))
    assert not lease.held and lease.lost.is_set()


async def hold_for(lease: Lease, seconds: float) -> bool:
    task = asyncio.create_task(lease.hold())
    await asyncio.sleep(seconds)
    alive = not task.done() and lease.held
    task.cancel()
    return alive


def router_report(used: dict) -> dict:
    return {"router": "r1", "uptime_s": 100.0, "used": used, "watched": {"x": 100.0}}


def test_a_leader_whose_host_clock_is_an_hour_ahead_keeps_times_on_the_databases(db):
    first = Lease(db.pool, "a", "http://a", ttl_s=5.0, renew_s=1.0)
    epoch = db.run(first.campaign())
    assert abs(first.clock_offset_s) < 1.0
    store = PostgresStore(db.pool, epoch)
    db.run(store.start())
    term = begin_term(store, SETTINGS, epoch, first.clock_offset_s)
    term.fleet.idle.report(router_report({"x": 0.0}))
    term.fleet.flush_activity()
    db.run(store.drain())
    db.run(first.release(epoch))

    ahead = Lease(db.pool, "b", "http://b", 5.0, 1.0, wall=lambda: time.time() + HOUR)
    epoch = db.run(ahead.campaign())
    assert ahead.clock_offset_s == pytest.approx(-HOUR, abs=1.0)
    store = PostgresStore(db.pool, epoch)
    db.run(store.start())
    real_time = time.time
    try:
        time.time = lambda: real_time() + HOUR  # the successor's host
        term = begin_term(store, SETTINGS, epoch, ahead.clock_offset_s)
        term.fleet.idle.report(router_report({}))
        seconds, state = term.fleet.idle.idle_for("x")
    finally:
        time.time = real_time
    assert state != IdleState.UNKNOWN
    assert seconds < 30, f"used moments ago, not {seconds:.0f} s ago by the new host's clock"
    store.close()


def test_a_leader_frozen_inside_a_write_transaction_does_not_hold_the_takeover_hostage(
    postgres_dsn,
):
    """The frozen leader's session sits idle in its transaction, the lease row locked: the
    database ends that session after `hold_s`, and the standby takes over; the frozen
    transaction never commits."""
    db = Database.__new__(Database)
    db.loop = asyncio.new_event_loop()
    db.pool = db.run(connect_pool(postgres_dsn, hold_s=0.5))
    db.run(migrate(db.pool))
    try:
        first = Lease(db.pool, "a", "http://a", ttl_s=1.0, renew_s=0.2)
        second = Lease(db.pool, "b", "http://b", ttl_s=1.0, renew_s=0.2)
        assert db.run(first.campaign()) == 1

        async def freeze_inside_a_write():
            conn = await db.pool.acquire()
            transaction = conn.transaction()
            await transaction.start()
            await conn.fetchval(FENCE)  # the row is locked as by a write in flight
            return conn, transaction

        conn, transaction = db.run(freeze_inside_a_write())
        # Its own renewal does not queue behind its write.
        renewed = db.run(asyncio.wait_for(conn_fetch(db.pool, RENEW, "a", 1, 1.0), timeout=0.4))
        assert renewed == 1
        started = time.monotonic()
        assert db.run(asyncio.wait_for(second.campaign(), timeout=5.0)) == 2
        took = time.monotonic() - started
        print(f"takeover past a leader frozen in a write transaction: {took:.2f} s")
        with pytest.raises(Exception):  # noqa: B017 - its session is gone, whatever asyncpg calls it
            db.run(transaction.commit())
        db.run(db.pool.release(conn, timeout=1))
        assert db.fetchval("SELECT holder FROM leader_lease WHERE id = 1") == "b"
    finally:
        db.run(db.pool.close())
        db.loop.close()


async def conn_fetch(pool, sql, *args):
    async with pool.acquire() as conn:
        return await conn.fetchval(sql, *args)

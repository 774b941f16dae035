"""The store's contract, on both stores: SQLite (the embedded default) and PostgreSQL (several
servers, one leader). PostgreSQL's runs on a real server (tests/postgres.py)."""

import asyncio
import sqlite3

import pytest

from controlplane.state.lease import Lease
from controlplane.state.pgstore import PostgresStore, connect_pool, migrate
from controlplane.state.store import MIGRATIONS, OutcomeUnknown, SqliteStore, StoreUnavailable
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice


class SqliteStores:
    def __init__(self, tmp_path) -> None:
        self.path = tmp_path / "s.sqlite"

    def open(self):
        return SqliteStore(self.path)

    def commit(self, store) -> None:
        asyncio.run(store.sync())

    def close(self, store) -> None:
        store.close()

    def make_schema_newer(self) -> None:
        db = sqlite3.connect(self.path)
        db.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
        db.close()

    def finish(self) -> None:
        pass


class PostgresStores:
    """Each `open` is a new leader's term: it takes the lease over, as a failover does."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = self.run(connect_pool(dsn))
        self.run(migrate(self.pool))
        self.terms = 0

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def open(self):
        self.terms += 1
        self.run(self.pool.execute("UPDATE leader_lease SET expires_at = now()"))
        lease = Lease(self.pool, f"server-{self.terms}", "http://127.0.0.1:1", 2.0, 0.5)
        store = PostgresStore(self.pool, self.run(lease.campaign()))
        self.run(store.start())
        return store

    def commit(self, store) -> None:
        self.run(store.sync())

    def close(self, store) -> None:
        self.run(store.drain())

    def make_schema_newer(self) -> None:
        self.run(self.pool.execute("UPDATE schema_version SET version = $1", len(MIGRATIONS) + 1))

    def finish(self) -> None:
        self.run(self.pool.close())
        self.loop.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def stores(request, tmp_path):
    if request.param == "sqlite":
        made = SqliteStores(tmp_path)
    else:
        made = PostgresStores(request.getfixturevalue("postgres_dsn"))
    yield made
    made.finish()


def spec(name="m"):
    return ModelSpec(name=name, gpu_class="H100-80GB", command=["x"])


def test_round_trip_of_everything_kept(stores):
    store = stores.open()
    replica = Replica(
        "m-1", "m", [Slice("n1", [0, 1])], state=ReplicaState.RETIRING, url="http://127.0.0.1:1"
    )
    node = Node("n1", "10.0.0.1", "ib-a", [GPU(0, "GPU-0", "H100-80GB")])
    with store.batch():
        store.put_spec(spec())
        store.put_node(node)
        store.put_replica(replica)
        store.put_last_used({"m-1": 123.5})
        store.put_scaled("m", 0)
        store.put_window("m", {"samples": [[1.0, 2]]})
        store.put_credential("n1", "digest")
        store.put_routers([{"id": "r1", "uptime_s": 5.0}], [], {"m-1": 99.0})
        store.put_record("demand_since/m", b"12.5")
        store.put_record("woken_at/m", b"13.5")
        store.put_record("woken_at/m", None)
    stores.commit(store)
    stores.close(store)
    again = stores.open()
    specs, nodes, replicas, last_used = again.load()
    assert specs["m"].command == ["x"]
    assert nodes["n1"].gpus == node.gpus
    assert replicas["m-1"] == replica
    assert last_used == {"m-1": 123.5}
    assert again.load_scaled() == {"m": 0}
    assert again.load_windows() == {"m": {"samples": [[1.0, 2]]}}
    assert again.load_credentials() == {"n1": "digest"}
    assert again.load_routers() == ([{"id": "r1", "uptime_s": 5.0}], {"m-1": 99.0})
    assert again.load_records() == {"demand_since/m": b"12.5"}
    stores.close(again)


def test_deletes_take_what_belongs_with_them(stores):
    store = stores.open()
    store.put_spec(spec())
    store.put_scaled("m", 1)
    store.put_replica(Replica("m-1", "m", [Slice("n1", [0])]))
    store.put_last_used({"m-1": 1.0})
    store.put_node(Node("n1", "10.0.0.1", "ib-a", []))
    store.put_credential("n1", "digest")
    store.delete_replica("m-1")
    store.delete_spec("m")
    store.delete_node("n1")
    stores.commit(store)
    stores.close(store)
    again = stores.open()
    assert again.load() == ({}, {}, {}, {})
    assert again.load_scaled() == {} and again.load_credentials() == {}
    stores.close(again)


def test_a_failed_batch_writes_nothing(stores):
    store = stores.open()
    with pytest.raises(RuntimeError):
        with store.batch():
            store.put_spec(spec())
            raise RuntimeError("boom")
    stores.commit(store)
    stores.close(store)
    again = stores.open()
    assert again.load()[0] == {}
    stores.close(again)


def test_a_newer_schema_is_refused(stores):
    stores.close(stores.open())
    stores.make_schema_newer()
    with pytest.raises(RuntimeError, match="upgrade gpufleet"):
        if isinstance(stores, SqliteStores):
            SqliteStore(stores.path)
        else:
            stores.run(migrate(stores.pool))


def test_a_deposed_leaders_write_is_refused_and_the_successors_state_stands(postgres_dsn):
    stores = PostgresStores(postgres_dsn)
    try:
        old = stores.open()
        old.put_spec(spec("before"))
        stores.commit(old)
        new = stores.open()  # takes the lease over: the epoch moves on
        old.put_spec(spec("after"))
        with pytest.raises(StoreUnavailable, match="epoch"):
            stores.commit(old)
        new.put_spec(spec("successor"))
        stores.commit(new)
        third = stores.open()
        assert sorted(third.load()[0]) == ["before", "successor"]
        epochs = stores.run(
            stores.pool.fetch("SELECT epoch, transactions FROM leader_writes ORDER BY epoch")
        )
        assert [(r["epoch"], r["transactions"]) for r in epochs] == [
            (old.epoch, 1),
            (new.epoch, 1),
        ]
        for store in (old, new, third):
            stores.close(store)
    finally:
        stores.finish()


def test_a_term_ended_mid_commit_says_the_outcome_is_unknown_not_that_nothing_was_made(
    postgres_dsn,
):
    """The COMMIT carrying `sent` is on its way when the term ends (a deferred trigger holds
    it): it may go through, and its caller hears so; `later`, queued behind it and never
    sent, was not made."""
    stores = PostgresStores(postgres_dsn)
    try:
        stores.run(
            stores.pool.execute(
                """
                CREATE FUNCTION slow_commit() RETURNS trigger AS
                    'BEGIN PERFORM pg_sleep(1); RETURN NULL; END' LANGUAGE plpgsql;
                CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON specs
                    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
                """
            )
        )
        store = stores.open()

        async def cut_mid_commit():
            store.put_spec(spec("sent"))
            sent = asyncio.ensure_future(store.sync())
            await asyncio.sleep(0.4)  # COMMIT is sent; the trigger holds it
            store.put_spec(spec("later"))
            later = asyncio.ensure_future(store.sync())
            await asyncio.sleep(0)
            store.close()  # the term ends
            return await asyncio.gather(sent, later, return_exceptions=True)

        sent, later = stores.run(cut_mid_commit())
        assert isinstance(sent, OutcomeUnknown), sent
        assert isinstance(later, StoreUnavailable) and not isinstance(later, OutcomeUnknown)
    finally:
        stores.finish()

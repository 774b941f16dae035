"""The control plane's state in PostgreSQL, for several servers on one database (one leader).

The store keeps SqliteStore's interface, which the fleet calls synchronously as it changes its
memory, but a PostgreSQL round trip must never hold the event loop: here a change is queued,
and one writer task commits what is queued, in order, in one transaction at a time (asyncpg).
Nothing that reveals a change leaves the server before `sync()` says it is committed, so an
answer is never an acknowledgement of a change that could still be lost.

Every transaction is fenced: it takes the lease row with FOR SHARE and aborts unless the epoch
is the one this leader was elected with. A takeover updates that row, so a write of an old
leader either commits before the takeover (and the new leader loads it) or sees the new epoch
and commits nothing. `leader_writes` keeps when each epoch last wrote, which is how a test (or
an operator) sees that a deposed leader wrote nothing after its successor took over.

A failed commit (the database gone, the lease lost) fails every waiting `sync()` and the term:
the server drops its memory and, once it leads again, loads the state anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from itertools import groupby

import asyncpg
import orjson

from controlplane.state.store import (
    COLUMNS,
    MIGRATIONS,
    WITH_NODE,
    WITH_REPLICA,
    WITH_SPEC,
    OutcomeUnknown,
    StoreUnavailable,
    statements,
)
from controlplane.vocabulary.model import ModelSpec, Node, Replica

log = logging.getLogger("gpufleet.store")
POSTGRES_TYPES = {"blob": "BYTEA", "real": "DOUBLE PRECISION"}
MIGRATION_LOCK = 0x67707566  # pg_advisory_xact_lock key: servers starting at once migrate once
HA_TABLES = [
    """CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS leader_lease (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        url TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        won_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL)""",
    """INSERT INTO leader_lease VALUES (1, '', '', 0, 'epoch', 'epoch') ON CONFLICT DO NOTHING""",
    """CREATE TABLE IF NOT EXISTS leader_writes (
        epoch BIGINT PRIMARY KEY,
        transactions BIGINT NOT NULL,
        first_at TIMESTAMPTZ NOT NULL,
        last_at TIMESTAMPTZ NOT NULL)""",
]
# KEY SHARE: the leader's own renewals (a plain UPDATE of the expiry) never wait for its
# writes, while a takeover, which locks the row FOR UPDATE first (controlplane/state/lease.py),
# waits for a write in flight to end and then fences it.
FENCE = "SELECT epoch FROM leader_lease WHERE id = 1 FOR KEY SHARE"
RECORD_WRITE = """INSERT INTO leader_writes VALUES ($1, 1, clock_timestamp(), clock_timestamp())
    ON CONFLICT (epoch) DO UPDATE
    SET transactions = leader_writes.transactions + 1, last_at = clock_timestamp()"""


class Fenced(StoreUnavailable):
    pass


def upsert(table: str, key: str, columns: int) -> str:
    values = ", ".join(f"${i}" for i in range(1, columns + 1))
    return f"INSERT INTO {table} VALUES ({values}) ON CONFLICT ({key}) DO UPDATE SET " + ", ".join(
        f"{c} = EXCLUDED.{c}" for c in COLUMNS[table][1:]
    )


UPSERT = {table: upsert(table, columns[0], len(columns)) for table, columns in COLUMNS.items()}


async def connect_pool(dsn: str, timeout_s: float = 5.0, hold_s: float = 2.0) -> asyncpg.Pool:
    """`hold_s`: the longest any session waits for a lock or sits in a transaction without
    sending: a leader frozen inside a write transaction loses its session (and the lease
    row's lock) after that, so it never holds its successor's takeover hostage. It must be
    below the lease's TTL."""
    held_ms = str(max(1, round(hold_s * 1000)))
    return await asyncpg.create_pool(
        dsn,
        min_size=2,
        max_size=4,
        timeout=timeout_s,
        command_timeout=timeout_s,
        server_settings={
            "lock_timeout": held_ms,
            "idle_in_transaction_session_timeout": held_ms,
        },
    )


async def migrate(pool: asyncpg.Pool) -> int:
    """Create or upgrade the schema; returns its version."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        for statement in HA_TABLES:
            await conn.execute(statement)
        version = await conn.fetchval("SELECT version FROM schema_version")
        if version is None:
            await conn.execute("INSERT INTO schema_version VALUES (0)")
            version = 0
        if version > len(MIGRATIONS):
            raise RuntimeError(
                f"the database has schema {version}, newer than this gpufleet "
                f"({len(MIGRATIONS)}): upgrade gpufleet"
            )
        for number in range(version + 1, len(MIGRATIONS) + 1):
            for statement in statements(number, POSTGRES_TYPES):
                await conn.execute(statement)
            await conn.execute("UPDATE schema_version SET version = $1", number)
        return len(MIGRATIONS)


class PostgresStore:
    def __init__(self, pool: asyncpg.Pool, epoch: int, may_write=lambda: True) -> None:
        """A store for one term of leadership, elected with `epoch`; `await start()` loads
        the state and starts the writer. `may_write`: False once the lease's deadline has
        passed, when the leader stops writing even before anyone takes over."""
        self.pool = pool
        self.epoch = epoch
        self.may_write = may_write
        self.rows: dict[str, list] = {}
        self.queue: list[list[tuple[str, tuple]]] = []  # transactions not yet sent
        self.current: list[tuple[str, tuple]] | None = None  # the open batch's statements
        self.queued = 0  # transactions queued this term
        self.committed = 0
        self.sending = 0  # transactions up to this one are in the commit now being made
        self.committing = False  # whether that commit's COMMIT has been sent
        self.failure: StoreUnavailable | None = None
        self.waiters: list[tuple[int, asyncio.Future]] = []
        self.wake = asyncio.Event()
        self.writer: asyncio.Task | None = None

    async def start(self) -> None:
        # One snapshot of every table, as of one moment.
        async with (
            self.pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            for table, columns in COLUMNS.items():
                self.rows[table] = await conn.fetch(f"SELECT {', '.join(columns)} FROM {table}")
        self.writer = asyncio.create_task(self._write_forever())

    # what the fleet reads once, as it starts a term

    def load(self):
        specs = {name: ModelSpec(**orjson.loads(body)) for name, body in self.rows["specs"]}
        nodes = {name: Node.from_dict(orjson.loads(body)) for name, body in self.rows["nodes"]}
        replicas = {
            rid: Replica.from_dict(orjson.loads(body)) for rid, _, body in self.rows["replicas"]
        }
        return specs, nodes, replicas, dict(self.rows["last_used"])

    def load_routers(self):
        return [orjson.loads(body) for _, body in self.rows["routers"]], dict(
            self.rows["unseen_until"]
        )

    def load_scaled(self):
        return dict(self.rows["scaled"])

    def load_windows(self):
        return {model: orjson.loads(body) for model, body in self.rows["autoscale_windows"]}

    def load_credentials(self):
        return dict(self.rows["node_credentials"])

    def load_records(self):
        return {key: bytes(body) for key, body in self.rows["records"]}

    # what the fleet changes

    @contextlib.contextmanager
    def batch(self):
        """Everything written inside is one transaction; nested batches join the outer one."""
        if self.current is not None:
            yield self
            return
        self.current = []
        try:
            yield self
        except BaseException:
            self.current = None
            raise
        done, self.current = self.current, None
        if done:
            self._queue(done)

    def _write(self, sql: str, *args) -> None:
        if self.current is not None:
            self.current.append((sql, args))
        else:
            self._queue([(sql, args)])

    def _queue(self, transaction: list[tuple[str, tuple]]) -> None:
        self.queue.append(transaction)
        self.queued += 1
        self.wake.set()

    def put_spec(self, spec: ModelSpec) -> None:
        self._write(UPSERT["specs"], spec.name, orjson.dumps(spec.to_dict()))

    def delete_spec(self, name: str) -> None:
        with self.batch():
            self._put_or_delete("specs", name, None)
            for table, column in WITH_SPEC:
                self._write(f"DELETE FROM {table} WHERE {column} = $1", name)

    def put_node(self, node: Node) -> None:
        self._write(UPSERT["nodes"], node.name, orjson.dumps(node.to_dict()))

    def put_replica(self, replica: Replica) -> None:
        self._write(UPSERT["replicas"], replica.id, replica.model, orjson.dumps(replica.to_dict()))

    def delete_replica(self, replica_id: str) -> None:
        with self.batch():
            for table, column in WITH_REPLICA:
                self._write(f"DELETE FROM {table} WHERE {column} = $1", replica_id)
            self._write("DELETE FROM replicas WHERE id = $1", replica_id)

    def put_last_used(self, last_used: dict[str, float]) -> None:
        with self.batch():
            for replica, at in last_used.items():
                self._write(UPSERT["last_used"], replica, at)

    def _put_or_delete(self, table: str, key: str, value) -> None:
        """The row of `key` in `table` holds `value`, or is gone when `value` is None."""
        if value is None:
            self._write(f"DELETE FROM {table} WHERE {COLUMNS[table][0]} = $1", key)
        else:
            self._write(UPSERT[table], key, value)

    def put_scaled(self, model: str, replicas: int | None) -> None:
        self._put_or_delete("scaled", model, replicas)

    def put_routers(self, routers: list[dict], removed: list[str], gaps: dict) -> None:
        with self.batch():
            for router in routers:
                self._write(UPSERT["routers"], router["id"], orjson.dumps(router))
            for router_id in removed:
                self._write("DELETE FROM routers WHERE id = $1", router_id)
            for replica, at in gaps.items():
                self._write(UPSERT["unseen_until"], replica, at)

    def put_credential(self, node: str, digest: str | None) -> None:
        self._put_or_delete("node_credentials", node, digest)

    def put_record(self, key: str, body: bytes | None) -> None:
        self._put_or_delete("records", key, body)

    def delete_node(self, name: str) -> None:
        with self.batch():
            self._write("DELETE FROM nodes WHERE name = $1", name)
            for table, column in WITH_NODE:
                self._write(f"DELETE FROM {table} WHERE {column} = $1", name)

    def put_window(self, model: str, window: dict | None) -> None:
        self._put_or_delete(
            "autoscale_windows", model, None if window is None else orjson.dumps(window)
        )

    # commits

    async def sync(self) -> None:
        """Returns once every change queued so far is committed; raises StoreUnavailable if
        it could not be (and then never will be, in this term)."""
        if self.failure is not None:
            raise self.failure
        if self.committed >= self.queued:
            return
        future = asyncio.get_running_loop().create_future()
        self.waiters.append((self.queued, future))
        await asyncio.shield(future)

    async def _write_forever(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue:
                taken, self.queue = self.queue, []
                self.sending = self.committed + len(taken)
                self.committing = False
                try:
                    await self._commit([s for transaction in taken for s in transaction])
                except Exception as exc:  # noqa: BLE001 - any failure ends the term alike
                    self._fail(exc, self._sent_and_unknown(exc))
                    return
                self.committed += len(taken)
                self._answer_waiters()

    def _sent_and_unknown(self, exc: Exception) -> bool:
        """Whether a failed commit may have gone through: only once COMMIT was sent and no
        answer came (a statement cut before it leaves the transaction to roll back), and
        not when the database answered with an error (it rolled the transaction back)."""
        return self.committing and not isinstance(exc, asyncpg.PostgresError)

    async def _commit(self, changes: list[tuple[str, tuple]]) -> None:
        """One transaction for everything queued since the last: runs of one statement are
        sent as one executemany, so a tick that writes a thousand rows is a few round trips."""
        if not self.may_write():
            raise Fenced(f"the lease of epoch {self.epoch} ran out before it was renewed")
        async with self.pool.acquire() as conn, conn.transaction():
            epoch = await conn.fetchval(FENCE)
            if epoch != self.epoch:
                raise Fenced(f"the lease is at epoch {epoch}, this server led epoch {self.epoch}")
            for sql, run in groupby(changes, key=lambda change: change[0]):
                await conn.executemany(sql, [args for _, args in run])
            await conn.execute(RECORD_WRITE, self.epoch)
            self.committing = True  # leaving the block sends COMMIT

    def _answer_waiters(self) -> None:
        still = []
        for upto, future in self.waiters:
            if upto <= self.committed:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((upto, future))
        self.waiters = still

    def _fail(self, exc: Exception, unknown: bool = False) -> None:
        failure = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(str(exc))
        log.error("a change could not be committed: %s", failure)
        self.failure = failure
        self._refuse_waiters(failure, unknown)

    def _refuse_waiters(self, failure: StoreUnavailable, unknown: bool) -> None:
        """Waiters for changes the failed commit carried hear that its outcome is not known
        (`unknown`); the others, whose changes were never sent, that they were not made."""
        for upto, future in self.waiters:
            if future.done():
                continue
            if unknown and upto <= self.sending:
                future.set_exception(
                    OutcomeUnknown(f"the commit was cut short ({failure}); it may have been made")
                )
            else:
                future.set_exception(failure)
        self.waiters = []

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Commit what is queued (a clean stop), then stop the writer."""
        with contextlib.suppress(StoreUnavailable, TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.sync()
        self.close()

    def close(self) -> None:
        # A commit in flight now is cut: what it carried may or may not be stored.
        in_flight = self.writer is not None and self.committing and self.sending > self.committed
        if self.writer is not None:
            self.writer.cancel()
        if self.failure is None:
            self.failure = StoreUnavailable("this server's term has ended")
        self._refuse_waiters(self.failure, in_flight)

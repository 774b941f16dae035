"""Durable state behind a small interface; SQLite (WAL) is the embedded default.

The control plane keeps its working state in memory and writes every accepted change here
before it answers, so a restart (or a kill -9) loses nothing that was acknowledged.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import orjson

from controlplane.vocabulary.model import ModelSpec, Node, Replica


def without_password(state: str) -> str:
    """A state's location as it may be shown or logged: a URL's password is left out."""
    parts = urlsplit(state)
    if not parts.password:
        return state
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


class StoreUnavailable(Exception):
    """A change could not be committed: the database is gone or this server no longer leads."""


class OutcomeUnknown(StoreUnavailable):
    """A change was sent to the database and its commit may have gone through: the term ended,
    or the connection broke, before the answer came. Nobody may send it again on its own."""


class Store(Protocol):
    def load(
        self,
    ) -> tuple[dict[str, ModelSpec], dict[str, Node], dict[str, Replica], dict[str, float]]: ...
    def batch(self) -> contextlib.AbstractContextManager: ...
    def put_spec(self, spec: ModelSpec) -> None: ...
    def delete_spec(self, name: str) -> None: ...
    def put_node(self, node: Node) -> None: ...
    def put_replica(self, replica: Replica) -> None: ...
    def delete_replica(self, replica_id: str) -> None: ...
    def put_last_used(self, last_used: dict[str, float]) -> None: ...
    def load_routers(self) -> tuple[list[dict], dict[str, float]]: ...
    def load_scaled(self) -> dict[str, int]: ...
    def put_scaled(self, model: str, replicas: int | None) -> None: ...
    def put_routers(self, routers: list[dict], removed: list[str], gaps: dict) -> None: ...
    def load_windows(self) -> dict[str, dict]: ...
    def load_credentials(self) -> dict[str, str]: ...
    def put_credential(self, node: str, digest: str | None) -> None: ...
    def delete_node(self, name: str) -> None: ...
    def put_window(self, model: str, window: dict | None) -> None: ...
    def load_records(self) -> dict[str, bytes]: ...
    def put_record(self, key: str, body: bytes | None) -> None: ...
    async def sync(self) -> None: ...  # returns once every change made so far is committed
    def close(self) -> None: ...


# Each entry moves the schema one version up; never edit one that has shipped. One list for both
# stores: `{blob}` and `{real}` are each dialect's types (SQLITE_TYPES, pgstore.POSTGRES_TYPES).
MIGRATIONS = [
    """
    CREATE TABLE specs (name TEXT PRIMARY KEY, body {blob} NOT NULL);
    CREATE TABLE nodes (name TEXT PRIMARY KEY, body {blob} NOT NULL);
    CREATE TABLE replicas (id TEXT PRIMARY KEY, model TEXT NOT NULL, body {blob} NOT NULL);
    CREATE TABLE last_used (replica TEXT PRIMARY KEY, at {real} NOT NULL);
    """,
    """
    CREATE TABLE routers (id TEXT PRIMARY KEY, body {blob} NOT NULL);
    CREATE TABLE unseen_until (replica TEXT PRIMARY KEY, at {real} NOT NULL);
    """,
    """
    CREATE TABLE scaled (model TEXT PRIMARY KEY, replicas INTEGER NOT NULL);
    """,
    """
    CREATE TABLE autoscale_windows (model TEXT PRIMARY KEY, body {blob} NOT NULL);
    """,
    """
    CREATE TABLE node_credentials (node TEXT PRIMARY KEY, digest TEXT NOT NULL);
    """,
    # What the leader acts on between ticks, per model: reservations of room, demand, wakes,
    # swap counts (controlplane/state/records.py); a new leader carries on from them.
    """
    CREATE TABLE records (key TEXT PRIMARY KEY, body {blob} NOT NULL);
    """,
]
SQLITE_TYPES = {"blob": "BLOB", "real": "REAL"}
# Every table's columns, its key first: both stores read and write through this one list.
COLUMNS = {
    "specs": ("name", "body"),
    "nodes": ("name", "body"),
    "replicas": ("id", "model", "body"),
    "last_used": ("replica", "at"),
    "routers": ("id", "body"),
    "unseen_until": ("replica", "at"),
    "scaled": ("model", "replicas"),
    "autoscale_windows": ("model", "body"),
    "node_credentials": ("node", "digest"),
    "records": ("key", "body"),
}
# What goes with a row when it is deleted: (table, its column that holds the key).
WITH_SPEC = (("scaled", "model"), ("autoscale_windows", "model"))
WITH_REPLICA = (("last_used", "replica"), ("unseen_until", "replica"))
WITH_NODE = (("node_credentials", "node"),)


def statements(number: int, types: dict[str, str]) -> list[str]:
    """Migration `number` (1-based) in one dialect, a statement each."""
    script = MIGRATIONS[number - 1].format(**types)
    return [statement.strip() for statement in script.split(";") if statement.strip()]


class SqliteStore:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA busy_timeout=5000")
        self._lock = threading.RLock()
        self._depth = 0
        self.migrate()

    @property
    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        version = self.schema_version
        if version > len(MIGRATIONS):
            raise RuntimeError(
                f"{self.path} has schema {version}, newer than this gpufleet "
                f"({len(MIGRATIONS)}): upgrade gpufleet"
            )
        for number in range(version + 1, len(MIGRATIONS) + 1):
            with self.batch():
                for statement in statements(number, SQLITE_TYPES):
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version={number}")

    @contextlib.contextmanager
    def batch(self):
        """One transaction for everything written inside; nested batches join the outer one."""
        with self._lock:
            if self._depth == 0:
                self.db.execute("BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self
            except BaseException:
                self._depth -= 1
                if self._depth == 0:
                    self.db.execute("ROLLBACK")
                raise
            self._depth -= 1
            if self._depth == 0:
                self.db.execute("COMMIT")

    def _rows(self, table: str) -> list[tuple]:
        return self.db.execute(f"SELECT {', '.join(COLUMNS[table])} FROM {table}").fetchall()

    def _put(self, table: str, rows) -> None:
        marks = ", ".join("?" * len(COLUMNS[table]))
        with self.batch():
            self.db.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", rows)

    def _delete(self, table: str, key, column: str | None = None) -> None:
        with self.batch():
            self.db.execute(f"DELETE FROM {table} WHERE {column or COLUMNS[table][0]} = ?", (key,))

    def _put_or_delete(self, table: str, key, value) -> None:
        """The row of `key` in `table` holds `value`, or is gone when `value` is None."""
        if value is None:
            self._delete(table, key)
        else:
            self._put(table, [(key, value)])

    def load(self):
        specs = {name: ModelSpec(**orjson.loads(body)) for name, body in self._rows("specs")}
        nodes = {name: Node.from_dict(orjson.loads(body)) for name, body in self._rows("nodes")}
        replicas = {
            rid: Replica.from_dict(orjson.loads(body)) for rid, _, body in self._rows("replicas")
        }
        return specs, nodes, replicas, dict(self._rows("last_used"))

    def put_spec(self, spec: ModelSpec) -> None:
        self._put("specs", [(spec.name, orjson.dumps(spec.to_dict()))])

    def delete_spec(self, name: str) -> None:
        with self.batch():
            self._delete("specs", name)
            for table, column in WITH_SPEC:
                self._delete(table, name, column)

    def put_node(self, node: Node) -> None:
        self._put("nodes", [(node.name, orjson.dumps(node.to_dict()))])

    def put_replica(self, replica: Replica) -> None:
        self._put("replicas", [(replica.id, replica.model, orjson.dumps(replica.to_dict()))])

    def delete_replica(self, replica_id: str) -> None:
        with self.batch():
            self._delete("replicas", replica_id)
            for table, column in WITH_REPLICA:
                self._delete(table, replica_id, column)

    def put_last_used(self, last_used: dict[str, float]) -> None:
        self._put("last_used", last_used.items())

    def load_routers(self) -> tuple[list[dict], dict[str, float]]:
        """The routers the idle tracker knew, and the gaps dead routers left per replica."""
        routers = [orjson.loads(body) for _, body in self._rows("routers")]
        return routers, dict(self._rows("unseen_until"))

    def load_scaled(self) -> dict[str, int]:
        """Models running fewer replicas than their spec asks, because they were idle."""
        return dict(self._rows("scaled"))

    def put_scaled(self, model: str, replicas: int | None) -> None:
        self._put_or_delete("scaled", model, replicas)

    def put_routers(self, routers: list[dict], removed: list[str], gaps: dict) -> None:
        with self.batch():
            self._put("routers", [(r["id"], orjson.dumps(r)) for r in routers])
            for router_id in removed:
                self._delete("routers", router_id)
            self._put("unseen_until", gaps.items())

    def load_credentials(self) -> dict[str, str]:
        """node -> the SHA-256 of the credential it was given at registration."""
        return dict(self._rows("node_credentials"))

    def put_credential(self, node: str, digest: str | None) -> None:
        self._put_or_delete("node_credentials", node, digest)

    def delete_node(self, name: str) -> None:
        with self.batch():
            self._delete("nodes", name)
            for table, column in WITH_NODE:
                self._delete(table, name, column)

    def load_windows(self) -> dict[str, dict]:
        """Autoscaled models' recommendation windows (controlplane/rules/autoscale.py)."""
        return {model: orjson.loads(body) for model, body in self._rows("autoscale_windows")}

    def put_window(self, model: str, window: dict | None) -> None:
        self._put_or_delete(
            "autoscale_windows", model, None if window is None else orjson.dumps(window)
        )

    def load_records(self) -> dict[str, bytes]:
        return {key: bytes(body) for key, body in self._rows("records")}

    def put_record(self, key: str, body: bytes | None) -> None:
        self._put_or_delete("records", key, body)

    async def sync(self) -> None:
        """Every change is committed as it is made here: nothing waits."""

    def close(self) -> None:
        self.db.close()

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

from controlplane.model import ModelSpec, Node, Replica


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
    # swap counts (controlplane/records.py); a new leader carries on from them.
    """
    CREATE TABLE records (key TEXT PRIMARY KEY, body {blob} NOT NULL);
    """,
]
SQLITE_TYPES = {"blob": "BLOB", "real": "REAL"}


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

    def load(self):
        specs = {
            name: ModelSpec(**orjson.loads(body))
            for name, body in self.db.execute("SELECT name, body FROM specs")
        }
        nodes = {
            name: Node.from_dict(orjson.loads(body))
            for name, body in self.db.execute("SELECT name, body FROM nodes")
        }
        replicas = {
            rid: Replica.from_dict(orjson.loads(body))
            for rid, body in self.db.execute("SELECT id, body FROM replicas")
        }
        last_used = dict(self.db.execute("SELECT replica, at FROM last_used"))
        return specs, nodes, replicas, last_used

    def put_spec(self, spec: ModelSpec) -> None:
        with self.batch():
            self.db.execute(
                "INSERT OR REPLACE INTO specs VALUES (?, ?)",
                (spec.name, orjson.dumps(spec.to_dict())),
            )

    def delete_spec(self, name: str) -> None:
        with self.batch():
            self.db.execute("DELETE FROM specs WHERE name = ?", (name,))
            self.db.execute("DELETE FROM scaled WHERE model = ?", (name,))
            self.db.execute("DELETE FROM autoscale_windows WHERE model = ?", (name,))

    def put_node(self, node: Node) -> None:
        with self.batch():
            self.db.execute(
                "INSERT OR REPLACE INTO nodes VALUES (?, ?)",
                (node.name, orjson.dumps(node.to_dict())),
            )

    def put_replica(self, replica: Replica) -> None:
        with self.batch():
            self.db.execute(
                "INSERT OR REPLACE INTO replicas VALUES (?, ?, ?)",
                (replica.id, replica.model, orjson.dumps(replica.to_dict())),
            )

    def delete_replica(self, replica_id: str) -> None:
        with self.batch():
            self.db.execute("DELETE FROM replicas WHERE id = ?", (replica_id,))
            self.db.execute("DELETE FROM last_used WHERE replica = ?", (replica_id,))
            self.db.execute("DELETE FROM unseen_until WHERE replica = ?", (replica_id,))

    def put_last_used(self, last_used: dict[str, float]) -> None:
        with self.batch():
            self.db.executemany("INSERT OR REPLACE INTO last_used VALUES (?, ?)", last_used.items())

    def load_routers(self) -> tuple[list[dict], dict[str, float]]:
        """The routers the idle tracker knew, and the gaps dead routers left per replica."""
        routers = [orjson.loads(body) for (body,) in self.db.execute("SELECT body FROM routers")]
        gaps = dict(self.db.execute("SELECT replica, at FROM unseen_until"))
        return routers, gaps

    def load_scaled(self) -> dict[str, int]:
        """Models running fewer replicas than their spec asks, because they were idle."""
        return dict(self.db.execute("SELECT model, replicas FROM scaled"))

    def put_scaled(self, model: str, replicas: int | None) -> None:
        with self.batch():
            if replicas is None:
                self.db.execute("DELETE FROM scaled WHERE model = ?", (model,))
            else:
                self.db.execute("INSERT OR REPLACE INTO scaled VALUES (?, ?)", (model, replicas))

    def put_routers(self, routers: list[dict], removed: list[str], gaps: dict) -> None:
        with self.batch():
            self.db.executemany(
                "INSERT OR REPLACE INTO routers VALUES (?, ?)",
                [(r["id"], orjson.dumps(r)) for r in routers],
            )
            self.db.executemany("DELETE FROM routers WHERE id = ?", [(i,) for i in removed])
            self.db.executemany("INSERT OR REPLACE INTO unseen_until VALUES (?, ?)", gaps.items())

    def load_credentials(self) -> dict[str, str]:
        """node -> the SHA-256 of the credential it was given at registration."""
        return dict(self.db.execute("SELECT node, digest FROM node_credentials"))

    def put_credential(self, node: str, digest: str | None) -> None:
        with self.batch():
            if digest is None:
                self.db.execute("DELETE FROM node_credentials WHERE node = ?", (node,))
            else:
                self.db.execute(
                    "INSERT OR REPLACE INTO node_credentials VALUES (?, ?)", (node, digest)
                )

    def delete_node(self, name: str) -> None:
        with self.batch():
            self.db.execute("DELETE FROM nodes WHERE name = ?", (name,))
            self.db.execute("DELETE FROM node_credentials WHERE node = ?", (name,))

    def load_windows(self) -> dict[str, dict]:
        """Autoscaled models' recommendation windows (controlplane/autoscale.py)."""
        rows = self.db.execute("SELECT model, body FROM autoscale_windows")
        return {model: orjson.loads(body) for model, body in rows}

    def put_window(self, model: str, window: dict | None) -> None:
        with self.batch():
            if window is None:
                self.db.execute("DELETE FROM autoscale_windows WHERE model = ?", (model,))
            else:
                self.db.execute(
                    "INSERT OR REPLACE INTO autoscale_windows VALUES (?, ?)",
                    (model, orjson.dumps(window)),
                )

    def load_records(self) -> dict[str, bytes]:
        return {key: bytes(body) for key, body in self.db.execute("SELECT key, body FROM records")}

    def put_record(self, key: str, body: bytes | None) -> None:
        with self.batch():
            if body is None:
                self.db.execute("DELETE FROM records WHERE key = ?", (key,))
            else:
                self.db.execute("INSERT OR REPLACE INTO records VALUES (?, ?)", (key, body))

    async def sync(self) -> None:
        """Every change is committed as it is made here: nothing waits."""

    def close(self) -> None:
        self.db.close()

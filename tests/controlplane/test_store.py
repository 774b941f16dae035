import sqlite3

import pytest

from controlplane.model import ModelSpec, Replica, ReplicaState, Slice
from controlplane.store import MIGRATIONS, SqliteStore


def test_round_trip_and_schema_version(tmp_path):
    store = SqliteStore(tmp_path / "s.sqlite")
    assert store.schema_version == len(MIGRATIONS)
    store.put_spec(ModelSpec(name="m", gpu_class="H100-80GB", command=["x"]))
    replica = Replica(
        "m-1", "m", [Slice("n1", [0, 1])], state=ReplicaState.READY, url="http://127.0.0.1:1"
    )
    store.put_replica(replica)
    store.put_last_used({"m-1": 123.5})
    store.close()
    specs, nodes, replicas, last_used = SqliteStore(tmp_path / "s.sqlite").load()
    assert specs["m"].command == ["x"]
    assert replicas["m-1"] == replica
    assert last_used == {"m-1": 123.5}


def test_a_failed_batch_writes_nothing(tmp_path):
    store = SqliteStore(tmp_path / "s.sqlite")
    with pytest.raises(RuntimeError):
        with store.batch():
            store.put_spec(ModelSpec(name="m", gpu_class="H100-80GB", command=["x"]))
            raise RuntimeError("boom")
    assert store.load()[0] == {}


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(RuntimeError, match="upgrade gpufleet"):
        SqliteStore(path)

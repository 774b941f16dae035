"""How long a new leader takes between winning the lease and serving, on a large fleet's state.

The state is the fleet-scale bench's shape (16 fabrics of 1,000 nodes of 8 GPUs, 10 replicas a
model, 0.625 replicas a node, all Ready) written to a real PostgreSQL by a first leader. A
second then takes the lease over and does what `controlplane/server.py`'s `lead()` does before
it answers as the leader: load every row, build the fleet, run the first reconcile tick.

    .venv/bin/python -m bench.leader_load 16000 2000
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time

from controlplane.server import GC_THRESHOLDS, Settings, begin_term
from controlplane.state.lease import Lease
from controlplane.state.pgstore import PostgresStore, connect_pool, migrate
from controlplane.vocabulary.model import ReplicaState

GPUS_PER_NODE = 8
FABRIC_NODES = 1000
REPLICAS_PER_NODE = 0.625
REPLICAS_PER_MODEL = 10
SETTINGS = Settings("127.0.0.1", 0, "postgresql://", {}, node_timeout_s=3600.0)


async def take_lease(pool, holder: str) -> int:
    await pool.execute("UPDATE leader_lease SET expires_at = now()")
    return await Lease(pool, holder, "http://127.0.0.1:1", 5.0, 1.0).campaign()


async def build_state(pool, nodes: int) -> int:
    """A first leader registers `nodes` nodes, applies the models and has them all Ready;
    returns the replicas it stored."""
    store = PostgresStore(pool, await take_lease(pool, "builder"))
    await store.start()
    term = begin_term(store, SETTINGS)
    fleet = term.fleet
    for i in range(nodes):
        fleet.register(
            {
                "name": f"node-{i:05d}",
                "address": "10.0.0.1",
                "fabric": f"fabric-{i // FABRIC_NODES}",
                "gpus": [
                    {"index": g, "uuid": f"GPU-{i}-{g}", "gpu_class": "H100-80GB"}
                    for g in range(GPUS_PER_NODE)
                ],
            }
        )
    for k in range(int(nodes * REPLICAS_PER_NODE) // REPLICAS_PER_MODEL):
        fleet.apply(
            {
                "name": f"model-{k}",
                "gpu_class": "H100-80GB",
                "command": ["gpuctl", "sim-engine", "--port", "{port}"],
                "gpus_per_replica": 1 + k % 8,
                "replicas": REPLICAS_PER_MODEL,
            }
        )
    term.reconciler.tick()
    for replica in list(fleet.replicas.values()):
        fleet.set_replica_state(replica, ReplicaState.READY)
    await store.drain(timeout_s=600)
    return len(fleet.replicas)


async def load_as_leader(pool) -> tuple[float, int, int]:
    """Seconds from a won lease to a term ready to serve, and the nodes and Ready replicas
    it found."""
    epoch = await take_lease(pool, "successor")
    started = time.perf_counter()
    store = PostgresStore(pool, epoch)
    await store.start()
    term = begin_term(store, SETTINGS, epoch)
    took = time.perf_counter() - started
    store.close()
    return (
        took,
        len(term.fleet.nodes),
        sum(r.state == ReplicaState.READY for r in term.fleet.replicas.values()),
    )


def measure(dsn: str, nodes: int, rounds: int = 3) -> tuple[int, float]:
    """(replicas, the median load time of `rounds` takeovers) on a fresh database at `dsn`."""

    async def run():
        gc.set_threshold(*GC_THRESHOLDS)  # as the server runs
        pool = await connect_pool(dsn, timeout_s=600)
        try:
            await migrate(pool)
            replicas = await build_state(pool, nodes)
            loads = [await load_as_leader(pool) for _ in range(rounds)]
            for _, loaded_nodes, ready in loads:
                assert (loaded_nodes, ready) == (nodes, replicas), "the whole state was loaded"
            times = sorted(took for took, _, _ in loads)
            return replicas, times[len(times) // 2]
        finally:
            await pool.close()

    return asyncio.run(run())


def main(sizes: list[int]) -> None:
    from tests.postgres import PostgresServer

    server = PostgresServer()
    try:
        for nodes in sizes:
            name = f"leader_load_{nodes}"
            server.create_database(name)
            replicas, took = measure(server.dsn_of(name), nodes)
            print(f"{nodes:,} nodes / {replicas:,} replicas: serving {took:.2f} s after the lease")
    finally:
        server.close()


if __name__ == "__main__":
    main([int(n) for n in sys.argv[1:]] or [2000])

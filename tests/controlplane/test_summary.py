from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.state.fleet import FleetSnapshot
from controlplane.views.summary import node_rows, replica_rows, summary
from controlplane.vocabulary.idle import IdleState, IdleTracker
from controlplane.vocabulary.model import (
    GPU,
    HOLDING,
    ModelSpec,
    Node,
    Replica,
    ReplicaState,
    Schedulable,
    Slice,
)

CLASSES = ["H100-80GB", "A100-80GB", "L40S-48GB"]


@st.composite
def snapshots(draw):
    nodes = []
    for i in range(draw(st.integers(0, 10))):
        gpus = [
            GPU(j, f"u{i}-{j}", draw(st.sampled_from(CLASSES)), healthy=draw(st.booleans()),
                memory_mb=draw(st.sampled_from([0, 46068, 81559])))  # fmt: skip
            for j in range(draw(st.integers(0, 8)))
        ]
        nodes.append(
            Node(
                f"n{i}",
                "127.0.0.1",
                draw(st.sampled_from(["f1", "f2"])),
                gpus,
                schedulable=draw(st.sampled_from(list(Schedulable))),
                ready=draw(st.booleans()),
            )
        )
    specs = [
        ModelSpec(
            name=f"m{k}",
            gpu_class=draw(st.sampled_from(CLASSES)),
            command=["x"],
            replicas=draw(st.integers(0, 3)),
            gpu_memory_mb=draw(st.sampled_from([None, 20_000, 40_000])),
        )
        for k in range(draw(st.integers(0, 3)))
    ]
    replicas, idle, taken = [], {}, set()
    for k in range(draw(st.integers(0, 12))):
        if not nodes or not specs:
            break
        node = draw(st.sampled_from(nodes))
        shared = draw(st.booleans())  # several engines on one card
        free = [g.index for g in node.gpus if shared or (node.name, g.index) not in taken]
        picked = draw(st.lists(st.sampled_from(free), unique=True, max_size=3)) if free else []
        taken.update((node.name, i) for i in picked)
        replica = Replica(
            f"r{k}",
            draw(st.sampled_from(specs)).name,
            [Slice(node.name, picked)],
            state=draw(st.sampled_from(list(ReplicaState))),
        )
        replicas.append(replica)
        state = draw(st.sampled_from(list(IdleState)))
        seconds = -1.0 if state == IdleState.UNKNOWN else draw(st.floats(0, 10_000))
        idle[replica.id] = (seconds, state)
    reasons = {s.name: "no room" for s in specs if draw(st.booleans())}
    return FleetSnapshot(nodes, replicas, specs, reasons, idle, now=1e6)


@settings(max_examples=300, deadline=None)
@given(snapshots(), st.sampled_from([None, 0.0, 600.0]))
def test_summary_is_the_aggregate_of_the_rows(snap, threshold):
    result = summary(snap, threshold)
    nodes = node_rows(snap)
    replicas = replica_rows(snap)
    for gpu_class, counts in result["capacity"].items():
        for key in ("used", "free", "unavailable", "unhealthy", "total"):
            assert counts[key] == sum(
                r["gpus_by_class"].get(gpu_class, {}).get(key, 0) for r in nodes
            )
        assert (
            counts["used"] + counts["free"] + counts["unavailable"] + counts["unhealthy"]
            == counts["total"]
        )
    for gpu_class, memory in result["memory"].items():
        for key in ("held_mb", "total_mb"):
            assert memory[key] == sum(
                r["memory_by_class"].get(gpu_class, {}).get(key, 0) for r in nodes
            )
        assert 0 <= memory["held_mb"] <= memory["total_mb"]
    for row in nodes:
        for card in row["cards"]:
            assert bool(card["residents"]) == (card["held_mb"] > 0)
    unhealthy = {(n.name, g.index) for n in snap.nodes for g in n.gpus if not g.healthy}
    total_unhealthy = sum(c["unhealthy"] for c in result["capacity"].values())
    assert total_unhealthy == len(unhealthy), "an unhealthy GPU is neither used nor free"
    assert sum(c["total"] for c in result["capacity"].values()) == sum(
        len(n.gpus) for n in snap.nodes
    )
    assert result["replicas"]["by_state"] == dict(Counter(r["state"] for r in replicas))
    assert result["nodes"]["ready"] + result["nodes"]["not_ready"] == len(snap.nodes)
    assert sum(f["whole_free"] for f in result["fabrics"].values()) == sum(
        r["whole_free"] for r in nodes
    )
    for row in result["idle"]["replicas"]:
        assert row["idle_state"] != "unknown", "unknown is never idle"
        assert row["idle_s"] >= (threshold if threshold is not None else 1800.0)
    assert result["idle"]["gpus_held"] == sum(r["gpus"] for r in result["idle"]["replicas"])
    # The summary counts without building every row: each list it shows is the rows' own.
    holding_states = {str(s) for s in HOLDING} | {"Degraded"}
    holding = [r for r in replicas if r["state"] in holding_states]
    limit = {s.name: s.idle_after_s for s in snap.specs}
    idle_ids = {
        r["id"]
        for r in holding
        if r["idle_state"] != "unknown"
        and r["idle_s"] >= (threshold if threshold is not None else limit[r["model"]])
    }
    assert {r["id"] for r in result["idle"]["replicas"]} == idle_ids
    assert result["idle"]["unknown"] == sum(r["idle_state"] == "unknown" for r in holding)
    assert [r["id"] for r in result["degraded_replicas"]] == [
        r["id"] for r in replicas if r["state"] == "Degraded"
    ]
    assert [r["id"] for r in result["failed_replicas"]] == [
        r["id"] for r in replicas if r["state"] == "Failed"
    ]
    assert result["not_ready_nodes"] == [
        {"name": r["name"], "fabric": r["fabric"]} for r in nodes if not r["ready"]
    ]
    for state in ("cordoned", "draining"):
        assert result["nodes"][state] == sum(r["schedulable"] == state for r in nodes)
    for group in result["fabrics_by_class"]:
        members = [
            r
            for r in nodes
            if r["fabric"] == group["fabric"] and group["gpu_class"] in r["gpu_classes"]
        ]
        assert (group["nodes"], group["ready"], group["whole_free"]) == (
            len(members),
            sum(r["ready"] for r in members),
            sum(r["whole_free"] for r in members),
        )


class TickingClock:
    """A clock that moves on at every read, as a busy server's does between two views."""

    def __init__(self, start: float, step: float) -> None:
        self.now, self.step = start, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_snapshot_is_one_moment_even_as_a_router_falls_silent(tmp_path):
    """A router whose lease runs out while a snapshot is taken is live in every view of that
    snapshot or silent in every one: the summary never counts it silent with no replica
    unknown because of it (or a replica unknown with no silent router)."""
    from controlplane.state.fleet import Fleet
    from controlplane.state.store import SqliteStore
    from tests.controlplane.conftest import make_node

    start = 1_000_000.0
    for step in (0.001, 0.01, 0.05, 0.2):
        for offset in range(-6, 7):
            clock = TickingClock(start, step)
            store = SqliteStore(tmp_path / f"state-{step}-{offset}.sqlite")
            fleet = Fleet(store, IdleTracker(live_window_s=10, clock=clock), wall=clock)
            fleet.register(make_node("n1", gpus=2))
            fleet.apply({"name": "m", "gpu_class": "H100-80GB", "command": ["x"], "replicas": 2})
            for i in range(2):
                fleet.add_replica("m", [Slice("n1", [i])])
            ids = list(fleet.replicas)
            fleet.idle.report(
                {
                    "router": "edge",
                    "incarnation": "i1",
                    "uptime_s": 60,
                    "used": {},
                    "watched": dict.fromkeys(ids, 60),
                }
            )
            # The lease ends within a few of this snapshot's clock reads.
            clock.now = fleet.idle.routers["edge"].received_at + 10 + offset * step / 2 - step
            snap = fleet.snapshot()
            silent = sum(r["state"] == "silent" for r in snap.routers)
            unknown = {r for r, (_, state) in snap.idle.items() if state is IdleState.UNKNOWN}
            assert unknown == snap.unknown_by_silence == (set(ids) if silent else set())
            counts = summary(snap)["routers"]
            assert (counts["silent"], counts["unknown_replicas"]) in ((0, 0), (1, 2))
            store.close()


def capacity_from_rows(snap) -> dict:
    totals: dict = {}
    for row in node_rows(snap):
        for gpu_class, counts in row["gpus_by_class"].items():
            into = totals.setdefault(gpu_class, dict.fromkeys(counts, 0))
            for key, n in counts.items():
                into[key] += n
    return totals


def test_a_node_kept_from_the_last_summary_is_counted_again_once_it_changes(make_fleet):
    # The summary keeps each node's shape across snapshots (controlplane/views/shapes.py); every
    # kind of change to a node must still reach the next summary.
    from tests.controlplane.conftest import make_node, spec

    fleet, reconciler = make_fleet()
    for name in ("n1", "n2"):
        fleet.register(make_node(name, gpus=4))

    def check():
        snap = fleet.snapshot()
        result = summary(snap)
        assert result["capacity"] == capacity_from_rows(snap)
        return result

    assert check()["capacity"]["H100-80GB"]["free"] == 8
    fleet.heartbeat("n1", {"gpus": [{"index": 0, "healthy": False, "reason": "Xid 79"}]})
    result = check()
    assert result["capacity"]["H100-80GB"]["unhealthy"] == 1
    assert result["unhealthy_gpus"] == [{"node": "n1", "index": 0, "reason": "Xid 79"}]
    fleet.set_schedulable("n2", Schedulable.CORDONED)
    assert check()["capacity"]["H100-80GB"]["unavailable"] == 4
    fleet.set_schedulable("n2", Schedulable.SCHEDULABLE)
    fleet.apply(spec(name="m", gpus_per_replica=2, replicas=1))
    reconciler.tick()
    result = check()
    assert result["capacity"]["H100-80GB"]["used"] == 2
    fleet.nodes["n2"].ready = False  # what the reconciler does when heartbeats stop
    result = check()
    assert result["nodes"]["not_ready"] == 1 and result["not_ready_nodes"][0]["name"] == "n2"

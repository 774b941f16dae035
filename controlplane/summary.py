"""The tables (`nodes`, `replicas`, `models`) and `gpuctl status`'s summary, all from one snapshot.

The summary's numbers are aggregates of the rows, so the screen and the tables cannot
disagree. A GPU is in exactly one of: used (healthy, held by a replica), free (healthy, unheld,
on a Ready schedulable node), unavailable (healthy, unheld, on a node that takes no work) or
unhealthy.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from controlplane.fleet import FleetSnapshot
from controlplane.idle import IdleState
from controlplane.model import HOLDING, ReplicaState, Schedulable, gpu_faults
from controlplane.placement import eligible

CAPACITY_KEYS = ("used", "free", "unavailable", "unhealthy", "total")
ROUTER_STATES = ("live", "silent", "gone")


def _held(snap: FleetSnapshot) -> dict[tuple[str, int], str]:
    return {
        (piece.node, index): r.id
        for r in snap.replicas
        if r.state in HOLDING
        for piece in r.placement
        for index in piece.gpus
    }


def node_status(node) -> str:
    status = "Ready" if node.ready else "NotReady"
    if node.schedulable == Schedulable.CORDONED:
        status += ",SchedulingDisabled"
    elif node.schedulable == Schedulable.DRAINING:
        status += ",Draining"
    return status


def node_rows(snap: FleetSnapshot, nodes=None) -> list[dict]:
    """The rows of `nodes` (all of the snapshot's, sorted by name, when None): a page of a
    large fleet is built without the rest of it."""
    held = _held(snap)
    replicas_on = Counter(node for r in snap.replicas if r.state in HOLDING for node in r.nodes)
    rows = []
    for node in sorted(snap.nodes, key=lambda n: n.name) if nodes is None else nodes:
        by_class: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CAPACITY_KEYS, 0))
        for gpu in node.gpus:
            counts = by_class[gpu.gpu_class]
            counts["total"] += 1
            if not gpu.healthy:
                counts["unhealthy"] += 1
            elif (node.name, gpu.index) in held:
                counts["used"] += 1
            elif eligible(node):
                counts["free"] += 1
            else:
                counts["unavailable"] += 1
        totals = {key: sum(c[key] for c in by_class.values()) for key in CAPACITY_KEYS}
        rows.append(
            {
                "name": node.name,
                "status": node_status(node),
                "ready": node.ready,
                "schedulable": str(node.schedulable),
                "fabric": node.fabric,
                "address": node.address,
                "gpu_classes": sorted(by_class),
                "gpus": totals,
                "gpus_by_class": {k: dict(v) for k, v in sorted(by_class.items())},
                "whole_free": eligible(node)
                and bool(node.gpus)
                and totals["free"] == totals["total"],
                "replicas": replicas_on[node.name],
                "unhealthy_gpus": [
                    {"index": g.index, "reason": g.reason} for g in node.gpus if not g.healthy
                ],
            }
        )
    return rows


DEGRADED = "Degraded"  # shown for a replica that holds a failed GPU
HOLDING_ROWS = {str(s) for s in HOLDING} | {DEGRADED}


def replica_rows(snap: FleetSnapshot) -> list[dict]:
    rows = []
    nodes = {n.name: n for n in snap.nodes}
    for replica in sorted(snap.replicas, key=lambda r: (r.model, r.id)):
        seconds, state = snap.idle.get(replica.id, (-1.0, IdleState.UNKNOWN))
        holding = replica.state in HOLDING
        faults = gpu_faults(replica, nodes) if holding else []
        shown = DEGRADED if faults and replica.state != ReplicaState.STOPPING else replica.state
        rows.append(
            {
                "id": replica.id,
                "model": replica.model,
                "state": str(shown),
                "nodes": replica.nodes,
                # Cards it holds; of those, the failed ones count as unhealthy, not used.
                "gpus": replica.gpu_count if holding else 0,
                "gpus_unhealthy": len(faults),
                "placement": [{"node": p.node, "gpus": p.gpus} for p in replica.placement],
                "url": replica.url,
                "idle_s": round(seconds, 1) if state != IdleState.UNKNOWN else -1,
                "idle_state": str(state),
                "reason": "; ".join(faults) or replica.reason,
                "age_s": round(max(0.0, snap.now - replica.created_at), 1),
                "exit_code": replica.exit_code,
            }
        )
    return rows


SWAP_WINDOW_S = 3600.0


def model_state(
    desired: int, ready: int, reason: str, waiting: int = 0, room: dict | None = None
) -> str:
    if desired == 0:
        return "ScaledToZero"
    if room is not None and not room["final"] and ready < desired:
        return "WaitingForRoom"
    if ready == 0 and waiting and not reason:
        return "Waking"
    if reason and ready == 0:
        return "Unplaceable"
    if ready >= desired:
        return "Ready"
    if ready == 0:
        return "Pending"
    return "Degraded"


def model_rows(snap: FleetSnapshot) -> list[dict]:
    rows = []
    by_model: dict[str, list] = defaultdict(list)
    for replica in snap.replicas:
        by_model[replica.model].append(replica)
    for spec in sorted(snap.specs, key=lambda s: s.name):
        mine = by_model.get(spec.name, [])
        states = Counter(str(r.state) for r in mine)
        ready = states.get(str(ReplicaState.READY), 0)
        reason = snap.reasons.get(spec.name, "")
        desired = snap.desired.get(spec.name, spec.replicas)
        waiting = snap.waiting.get(spec.name, 0)
        room = snap.room.get(spec.name)
        scaling = snap.autoscale.get(spec.name)
        rows.append(
            {
                "name": spec.name,
                "gpu_class": spec.gpu_class,
                "gpus_per_replica": spec.gpus_per_replica,
                "nodes_per_replica": spec.nodes_per_replica,
                "desired": desired,
                "replicas": spec.replicas,
                "min_replicas": spec.floor,
                "scale_to_zero_after_s": spec.scale_to_zero_after_s,
                "waiting": waiting,
                "ready": ready,
                "replicas_by_state": dict(sorted(states.items())),
                "state": model_state(desired, ready, reason, waiting, room),
                "reason": reason,
                "priority": spec.priority,
                "min_residency_s": spec.min_residency_s,
                "room_victims": list(room["victims"]) if room else [],
                "max_replicas": spec.ceiling,
                "target_in_flight": spec.target_in_flight,
                "scale_down_delay_s": spec.scale_down_delay_s,
                "autoscale": dict(scaling) if scaling else None,
                "idle_after_s": spec.idle_after_s,
                "generation": spec.generation,
            }
        )
    return rows


def summary(snap: FleetSnapshot, idle_after_s: float | None = None) -> dict:
    """The numbers of `gpuctl status`. `idle_after_s` None: each model's own threshold."""
    nodes = node_rows(snap)
    replicas = replica_rows(snap)
    models = model_rows(snap)
    capacity: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CAPACITY_KEYS, 0))
    for row in nodes:
        for gpu_class, counts in row["gpus_by_class"].items():
            for key in CAPACITY_KEYS:
                capacity[gpu_class][key] += counts[key]
    fabrics: dict[str, dict[str, int]] = defaultdict(
        lambda: {"nodes": 0, "ready": 0, "whole_free": 0}
    )
    # Free cards on another fabric or of another class are no capacity for a model that spans
    # nodes: whole free nodes count per (fabric, GPU class).
    fabric_classes: dict[tuple[str, str], dict[str, int]] = defaultdict(
        lambda: {"nodes": 0, "ready": 0, "whole_free": 0}
    )
    for row in nodes:
        for group in [fabrics[row["fabric"]]] + [
            fabric_classes[(row["fabric"], c)] for c in row["gpu_classes"]
        ]:
            group["nodes"] += 1
            group["ready"] += row["ready"]
            group["whole_free"] += row["whole_free"]
    thresholds = {spec.name: spec.idle_after_s for spec in snap.specs}
    idle = []
    for row in replicas:
        threshold = (
            idle_after_s if idle_after_s is not None else thresholds.get(row["model"], 1800.0)
        )
        if (
            row["state"] in HOLDING_ROWS
            and row["idle_state"] != "unknown"
            and row["idle_s"] >= threshold
        ):
            idle.append(
                {
                    key: row[key]
                    for key in ("id", "model", "state", "nodes", "gpus", "idle_s", "idle_state")
                }
            )
    idle.sort(key=lambda r: (-r["gpus"], -r["idle_s"], r["id"]))
    return {
        "capacity": {k: v for k, v in sorted(capacity.items())},
        "fabrics": {k: v for k, v in sorted(fabrics.items())},
        "fabrics_by_class": [
            {"fabric": fabric, "gpu_class": gpu_class, **counts}
            for (fabric, gpu_class), counts in sorted(fabric_classes.items())
        ],
        "nodes": {
            "total": len(nodes),
            "ready": sum(r["ready"] for r in nodes),
            "not_ready": sum(not r["ready"] for r in nodes),
            "cordoned": sum(r["schedulable"] == "cordoned" for r in nodes),
            "draining": sum(r["schedulable"] == "draining" for r in nodes),
        },
        "replicas": {
            "total": len(replicas),
            "by_state": dict(sorted(Counter(r["state"] for r in replicas).items())),
        },
        "models": {
            "total": len(models),
            "by_state": dict(sorted(Counter(r["state"] for r in models).items())),
        },
        "scaled_to_zero": {
            "models": sum(r["state"] == "ScaledToZero" and r["replicas"] > 0 for r in models),
            "gpus_held": sum(
                r["gpus"] for r in replicas if r["state"] == str(ReplicaState.RETIRING)
            ),
            "waking": {r["name"]: r["waiting"] for r in models if r["state"] == "Waking"},
        },
        "room": {
            "swaps_last_hour": sum(1 for at, _, _ in snap.swaps if snap.now - at <= SWAP_WINDOW_S),
            "waiting_for_room": {
                r["name"]: r["reason"] for r in models if r["state"] == "WaitingForRoom"
            },
        },
        "waiting": dict(snap.waiting),
        "unplaceable": [
            {
                "model": r["name"],
                "reason": r["reason"],
                "gpu_class": r["gpu_class"],
                "nodes_per_replica": r["nodes_per_replica"],
            }
            for r in models
            if r["reason"] and r["state"] != "WaitingForRoom"
        ],
        "idle": {
            "threshold_s": idle_after_s,
            "replicas": idle,
            "gpus_held": sum(r["gpus"] for r in idle),
            "unknown": sum(
                r["idle_state"] == "unknown" for r in replicas if r["state"] in HOLDING_ROWS
            ),
        },
        "routers": {
            **{state: sum(r["state"] == state for r in snap.routers) for state in ROUTER_STATES},
            "unknown_replicas": sum(
                r["id"] in snap.unknown_by_silence for r in replicas if r["state"] in HOLDING_ROWS
            ),
        },
        "unhealthy_gpus": [{"node": r["name"], **g} for r in nodes for g in r["unhealthy_gpus"]],
        "not_ready_nodes": [
            {"name": r["name"], "fabric": r["fabric"]} for r in nodes if not r["ready"]
        ],
        "degraded_replicas": [
            {key: r[key] for key in ("id", "model", "nodes", "reason", "gpus", "gpus_unhealthy")}
            for r in replicas
            if r["state"] == DEGRADED
        ],
        "failed_replicas": [
            {key: r[key] for key in ("id", "model", "nodes", "reason", "exit_code")}
            for r in replicas
            if r["state"] == str(ReplicaState.FAILED)
        ],
        "route_version": snap.route_version,
    }

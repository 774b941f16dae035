"""The tables (`nodes`, `replicas`, `models`) and `gpuctl status`'s summary, all from one snapshot.

The summary's numbers are aggregates of the rows, so the screen and the tables cannot
disagree. A GPU is in exactly one of: used (healthy, held by a replica), free (healthy, unheld,
on a Ready schedulable node), unavailable (healthy, unheld, on a node that takes no work) or
unhealthy.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from controlplane.rules.adapters import slot_id
from controlplane.rules.placement import eligible
from controlplane.rules.sleep import holds_card, is_sleeper, memory_of, sleeper_idle
from controlplane.state.fleet import FleetSnapshot
from controlplane.views.shapes import (
    CAPACITY_KEYS,
    FREE,
    TOTAL,
    Shapes,
    node_capacity,
)
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import HOLDING, ReplicaState, Schedulable, gpu_faults

ROUTER_STATES = ("live", "silent", "gone")


def _held(snap: FleetSnapshot) -> dict[str, frozenset[int]]:
    """The GPU indexes held on each node (by an awake engine: a sleeper leaves its card free
    for one, but for its reserve of memory)."""
    held: dict[str, set[int]] = defaultdict(set)
    for r in snap.replicas:
        if holds_card(r):
            for piece in r.placement:
                held[piece.node].update(piece.gpus)
    return {node: frozenset(indexes) for node, indexes in held.items()}


def card_memory(snap: FleetSnapshot) -> tuple[dict, dict]:
    """What engines hold of each card's memory (MiB, awake and asleep, at most the card) and
    who is on it: ({(node, index): MiB}, {(node, index): [replica ids]})."""
    specs = {s.name: s for s in snap.specs}
    nodes = {n.name: n for n in snap.nodes}
    memory = memory_of(snap.replicas, specs, nodes)
    residents: dict[tuple[str, int], list[str]] = defaultdict(list)
    for r in snap.replicas:
        if holds_card(r) or is_sleeper(r):
            for piece in r.placement:
                for index in piece.gpus:
                    residents[(piece.node, index)].append(r.id)
    return memory.used(), residents


def memory_by_class(node, held_mb: dict) -> dict[str, dict[str, int]]:
    """Per GPU class on `node`: memory held and memory there is, on its healthy cards."""
    out: dict[str, dict[str, int]] = {}
    for g in node.gpus:
        if not g.healthy:
            continue
        tally = out.setdefault(g.gpu_class, {"held_mb": 0, "total_mb": 0})
        tally["total_mb"] += g.memory_mb
        tally["held_mb"] += min(g.memory_mb or 0, held_mb.get((node.name, g.index), 0))
    return out


NO_GPUS: frozenset[int] = frozenset()
SHAPES = Shapes()  # kept across summaries (controlplane/views/shapes.py)


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
    held_mb, residents = card_memory(snap)
    replicas_on = Counter(node for r in snap.replicas if r.state in HOLDING for node in r.nodes)
    rows = []
    for node in sorted(snap.nodes, key=lambda n: n.name) if nodes is None else nodes:
        by_class = node_capacity(node, held.get(node.name, NO_GPUS))
        totals = [sum(tally[key] for tally in by_class.values()) for key in range(TOTAL + 1)]
        rows.append(
            {
                "name": node.name,
                "status": node_status(node),
                "ready": node.ready,
                "schedulable": str(node.schedulable),
                "fabric": node.fabric,
                "address": node.address,
                "gpu_classes": sorted(by_class),
                "gpus": dict(zip(CAPACITY_KEYS, totals, strict=True)),
                "gpus_by_class": {
                    k: dict(zip(CAPACITY_KEYS, v, strict=True)) for k, v in sorted(by_class.items())
                },
                "whole_free": eligible(node) and bool(node.gpus) and totals[FREE] == totals[TOTAL],
                "replicas": replicas_on[node.name],
                "unhealthy_gpus": [
                    {"index": g.index, "reason": g.reason} for g in node.gpus if not g.healthy
                ],
                "memory_by_class": memory_by_class(node, held_mb),
                "cards": [
                    {
                        "index": g.index,
                        "memory_mb": g.memory_mb,
                        "held_mb": held_mb.get((node.name, g.index), 0),
                        "residents": sorted(residents.get((node.name, g.index), [])),
                    }
                    for g in node.gpus
                ],
            }
        )
    return rows


DEGRADED = "Degraded"  # shown for a replica that holds a failed GPU


def shown_state(replica, nodes: dict) -> tuple[str, list[str]]:
    """The state a replica's row shows, and the faults of the GPUs it holds."""
    faults = gpu_faults(replica, nodes) if replica.state in HOLDING else []
    if faults and replica.state != ReplicaState.STOPPING:
        return DEGRADED, faults
    if replica.memory_over and replica.state in (
        ReplicaState.READY,
        ReplicaState.UNHEALTHY,
        ReplicaState.ASLEEP,  # over its reserve: its neighbours awake are short
    ):
        return DEGRADED, faults
    if replica.state == ReplicaState.READY and replica.engine_asleep:
        return str(ReplicaState.ASLEEP), faults  # Ready all the same: a request wakes it
    return str(replica.state), faults


def replica_row(snap: FleetSnapshot, replica, nodes: dict) -> dict:
    seconds, state = snap.idle.get(replica.id, (-1.0, IdleState.UNKNOWN))
    if replica.state == ReplicaState.ASLEEP and replica.sleep:
        # Nothing routes to a sleeper: as idle as when it fell asleep, and since.
        seconds, state = sleeper_idle(replica, snap.now), IdleState.AT_LEAST
    shown, faults = shown_state(replica, nodes)
    return {
        "id": replica.id,
        "model": replica.model,
        "state": shown,
        "nodes": replica.nodes,
        # Cards it holds; of those, the failed ones count as unhealthy, not used.
        "gpus": replica.gpu_count if replica.state in HOLDING else 0,
        "gpus_unhealthy": len(faults),
        "placement": [{"node": p.node, "gpus": p.gpus} for p in replica.placement],
        "url": replica.url,
        "idle_s": round(seconds, 1) if state != IdleState.UNKNOWN else -1,
        "idle_state": str(state),
        "reason": "; ".join(faults) or replica.memory_over or replica.reason,
        "gpu_memory_used_mb": replica.gpu_memory_used_mb,
        "age_s": round(max(0.0, snap.now - replica.created_at), 1),
        "exit_code": replica.exit_code,
        "sleep_level": replica.sleep,
        # its engine's own queue and KV use, as routers last read them (None: not read)
        "engine_load": snap.engine_load.get(replica.id),
        # LoRA adapters: those it serves, those that failed to load there, and how its loads
        # came about (ordered by the control plane, or made by its engine on a request)
        "adapters": [a for a in replica.want_adapters if a in replica.adapters],
        "adapter_failures": dict(replica.adapter_failures),
        "adapter_loads": snap.adapter_ways.get(replica.id, {"ordered": 0, "resolved": 0}),
    }


def replica_rows(snap: FleetSnapshot) -> list[dict]:
    nodes = {n.name: n for n in snap.nodes}
    return [
        replica_row(snap, replica, nodes)
        for replica in sorted(snap.replicas, key=lambda r: (r.model, r.id))
    ]


SWAP_WINDOW_S = 3600.0


def model_state(
    desired: int,
    ready: int,
    reason: str,
    waiting: int = 0,
    room: dict | None = None,
    asleep: int = 0,
) -> str:
    if desired == 0:
        return "ScaledToZero"
    if room is not None and not room["final"] and ready < desired:
        return "WaitingForRoom"
    if ready == 0 and waiting and not reason:
        return "Waking"
    if ready == 0 and asleep:
        return "Asleep"
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
                "state": model_state(
                    desired, ready, reason, waiting, room, states.get(str(ReplicaState.ASLEEP), 0)
                ),
                "reason": reason,
                "priority": spec.priority,
                "min_residency_s": spec.min_residency_s,
                "room_victims": list(room["victims"]) if room else [],
                "max_replicas": spec.ceiling,
                "target_in_flight": spec.target_in_flight,
                "target_waiting": spec.target_waiting,
                "scale_down_delay_s": spec.scale_down_delay_s,
                "autoscale": dict(scaling) if scaling else None,
                "idle_after_s": spec.idle_after_s,
                "sleep_level": spec.sleep_level,
                "sleep_after_s": spec.sleep_after_s,
                "generation": spec.generation,
            }
        )
    return rows


def _group() -> dict[str, int]:
    return {"nodes": 0, "ready": 0, "whole_free": 0}


def _node_numbers(snap: FleetSnapshot) -> dict:
    """The summary's node and capacity numbers: nodes are counted by shape (fabric, state, GPU
    tallies), each node's shape kept from the summary before unless it changed."""
    held = _held(snap)
    shapes: Counter = Counter()
    unhealthy, not_ready = [], []
    sick: dict[str, object] = {}  # nodes with an unhealthy GPU
    for node in sorted(snap.nodes, key=lambda n: n.name):
        shape = SHAPES.of(node, held.get(node.name, NO_GPUS))
        shapes[shape] += 1
        if not shape.ready:
            not_ready.append({"name": node.name, "fabric": node.fabric})
        if shape.sick:
            sick[node.name] = node
            unhealthy.extend(
                {"node": node.name, "index": g.index, "reason": g.reason}
                for g in node.gpus
                if not g.healthy
            )
    SHAPES.keep_only(len(snap.nodes))
    held_mb, _ = card_memory(snap)
    memory: dict[str, dict[str, int]] = {}
    for node in snap.nodes:
        for gpu_class, tally in memory_by_class(node, held_mb).items():
            total = memory.setdefault(gpu_class, {"held_mb": 0, "total_mb": 0})
            total["held_mb"] += tally["held_mb"]
            total["total_mb"] += tally["total_mb"]
    capacity: dict[str, list[int]] = defaultdict(lambda: [0] * len(CAPACITY_KEYS))
    fabrics: dict[str, dict[str, int]] = defaultdict(_group)
    # Free cards on another fabric or of another class are no capacity for a model that spans
    # nodes: whole free nodes count per (fabric, GPU class).
    fabric_classes: dict[tuple[str, str], dict[str, int]] = defaultdict(_group)
    counts = dict.fromkeys(("total", "ready", "not_ready", "cordoned", "draining"), 0)
    for shape, n in shapes.items():
        for gpu_class, tally in shape.tallies:
            column = capacity[gpu_class]
            for key, count in enumerate(tally):
                column[key] += count * n
        groups = [fabrics[shape.fabric]]
        groups += [fabric_classes[(shape.fabric, c)] for c, _ in shape.tallies]
        for group in groups:
            group["nodes"] += n
            group["ready"] += shape.ready * n
            group["whole_free"] += shape.whole_free * n
        counts["total"] += n
        counts["ready" if shape.ready else "not_ready"] += n
        if shape.schedulable != Schedulable.SCHEDULABLE:
            counts[shape.schedulable] += n
    return {
        "capacity": {
            k: dict(zip(CAPACITY_KEYS, v, strict=True)) for k, v in sorted(capacity.items())
        },
        "memory": dict(sorted(memory.items())),
        "fabrics": {k: v for k, v in sorted(fabrics.items())},
        "fabrics_by_class": [
            {"fabric": fabric, "gpu_class": gpu_class, **group}
            for (fabric, gpu_class), group in sorted(fabric_classes.items())
        ],
        "nodes": counts,
        "unhealthy_gpus": unhealthy,
        "not_ready_nodes": not_ready,
        "sick": sick,
    }


def by_model_and_id(row: dict) -> tuple[str, str]:
    return row["model"], row["id"]


IDLE_KEYS = ("id", "model", "state", "nodes", "gpus", "idle_s", "idle_state")
DEGRADED_KEYS = ("id", "model", "nodes", "reason", "gpus", "gpus_unhealthy")
FAILED_KEYS = ("id", "model", "nodes", "reason", "exit_code")


def _replica_numbers(snap: FleetSnapshot, idle_after_s: float | None, nodes: dict) -> dict:
    """The summary's replica numbers. A full row is built only for a replica the summary
    lists (idle, degraded, failed); the rest are counted. `nodes`: those with an unhealthy
    GPU, the only ones where a replica's GPUs can be at fault."""
    thresholds = {spec.name: spec.idle_after_s for spec in snap.specs}
    by_state: Counter[str] = Counter()
    idle, degraded, failed = [], [], []
    retiring_gpus = unknown = unknown_by_silence = 0
    for replica in snap.replicas:
        shown, _ = shown_state(replica, nodes)
        by_state[shown] += 1
        if shown == str(ReplicaState.RETIRING):
            retiring_gpus += replica.gpu_count
        if shown == DEGRADED:
            degraded.append(replica_row(snap, replica, nodes))
        elif shown == str(ReplicaState.FAILED):
            failed.append(replica_row(snap, replica, nodes))
        if shown != DEGRADED and replica.state not in HOLDING:
            continue
        unknown_by_silence += replica.id in snap.unknown_by_silence
        seconds, state = snap.idle.get(replica.id, (-1.0, IdleState.UNKNOWN))
        if state == IdleState.UNKNOWN:
            unknown += 1
            continue
        threshold = (
            idle_after_s if idle_after_s is not None else thresholds.get(replica.model, 1800.0)
        )
        if round(seconds, 1) >= threshold:
            idle.append(replica_row(snap, replica, nodes))
    idle.sort(key=lambda r: (-r["gpus"], -r["idle_s"], r["id"]))
    degraded.sort(key=by_model_and_id)
    failed.sort(key=by_model_and_id)
    return {
        "replicas": {"total": len(snap.replicas), "by_state": dict(sorted(by_state.items()))},
        "retiring_gpus": retiring_gpus,
        "idle": {
            "threshold_s": idle_after_s,
            "replicas": [{key: r[key] for key in IDLE_KEYS} for r in idle],
            "gpus_held": sum(r["gpus"] for r in idle),
            "unknown": unknown,
        },
        "unknown_by_silence": unknown_by_silence,
        "degraded_replicas": [{key: r[key] for key in DEGRADED_KEYS} for r in degraded],
        "failed_replicas": [{key: r[key] for key in FAILED_KEYS} for r in failed],
    }


def adapter_rows(snap: FleetSnapshot) -> list[dict]:
    """Each adapter, where it is loaded (with its idle state per replica), and why not."""
    where: dict[str, list[dict]] = defaultdict(list)
    for r in sorted(snap.replicas, key=lambda r: r.id):
        for name in r.want_adapters:
            seconds, state = snap.adapter_idle.get(slot_id(r.id, name), (-1.0, IdleState.UNKNOWN))
            where[name].append(
                {
                    "replica": r.id,
                    "state": "Loaded" if name in r.adapters else "Loading",
                    "idle_s": round(seconds, 1) if state != IdleState.UNKNOWN else -1,
                    "idle_state": str(state),
                }
            )
        for name in r.unloading:  # a dict: adapter -> route version
            where[name].append({"replica": r.id, "state": "Unloading", "idle_s": -1,
                                "idle_state": str(IdleState.UNKNOWN)})  # fmt: skip
        for name, why in r.adapter_failures.items():
            where[name].append({"replica": r.id, "state": "Failed", "reason": why, "idle_s": -1,
                                "idle_state": str(IdleState.UNKNOWN)})  # fmt: skip
    rows = []
    for adapter in sorted(snap.adapters, key=lambda a: a.name):
        holders = where.get(adapter.name, [])
        loaded = sum(h["state"] == "Loaded" for h in holders)
        waiting = snap.waiting.get(adapter.name, 0)
        unused = sum(
            h["state"] == "Loaded" and h["idle_s"] >= adapter.idle_after_s for h in holders
        )
        if loaded:
            state = "Loaded"
        elif any(h["state"] == "Loading" for h in holders):
            state = "Loading"
        else:
            state = "Waiting" if waiting else "NotLoaded"
        rows.append(
            {
                **adapter.to_dict(),
                "state": state,
                "loaded": loaded,
                "unused": unused,
                "waiting": waiting,
                "replicas": holders,
                "reason": snap.adapter_reasons.get(adapter.name, ""),
            }
        )
    return rows


def _adapter_numbers(snap: FleetSnapshot) -> dict:
    rows = adapter_rows(snap)
    return {
        "total": len(rows),
        "loaded": sum(r["loaded"] > 0 for r in rows),
        "loaded_replicas": sum(r["loaded"] for r in rows),
        "unused": sum(r["unused"] for r in rows),
        "waiting": {r["name"]: r["reason"] for r in rows if r["state"] == "Waiting"},
    }


def _sleep_numbers(snap: FleetSnapshot) -> dict:
    """Sleeping engines: how many, on how many cards, and the memory they keep."""
    specs = {s.name: s for s in snap.specs}
    nodes = {n.name: n for n in snap.nodes}
    memory = memory_of(snap.replicas, specs, nodes)
    asleep = [r for r in snap.replicas if r.state == ReplicaState.ASLEEP or r.engine_asleep]
    return {
        "replicas": len(asleep),
        "by_level": dict(sorted(Counter(str(r.sleep or "self") for r in asleep).items())),
        "cards": sum(1 for on in memory.sleepers_on.values() if on),
        "gpu_memory_mb": sum(memory.reserve.values()),
        "host_memory_mb": sum(memory.host_used.values()),
    }


def summary(snap: FleetSnapshot, idle_after_s: float | None = None) -> dict:
    """The numbers of `gpuctl status`. `idle_after_s` None: each model's own threshold."""
    fleet = _node_numbers(snap)
    replicas = _replica_numbers(snap, idle_after_s, fleet["sick"])
    models = model_rows(snap)
    return {
        "capacity": fleet["capacity"],
        "memory": fleet["memory"],
        "fabrics": fleet["fabrics"],
        "fabrics_by_class": fleet["fabrics_by_class"],
        "nodes": fleet["nodes"],
        "replicas": replicas["replicas"],
        "models": {
            "total": len(models),
            "by_state": dict(sorted(Counter(r["state"] for r in models).items())),
        },
        "scaled_to_zero": {
            "models": sum(r["state"] == "ScaledToZero" and r["replicas"] > 0 for r in models),
            "gpus_held": replicas["retiring_gpus"],
            "waking": {r["name"]: r["waiting"] for r in models if r["state"] == "Waking"},
        },
        "room": {
            "swaps_last_hour": sum(1 for at, _, _ in snap.swaps if snap.now - at <= SWAP_WINDOW_S),
            "waiting_for_room": {
                r["name"]: r["reason"] for r in models if r["state"] == "WaitingForRoom"
            },
        },
        "waiting": dict(snap.waiting),
        "asleep": _sleep_numbers(snap),
        "adapters": _adapter_numbers(snap),
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
        "idle": replicas["idle"],
        "routers": {
            **{state: sum(r["state"] == state for r in snap.routers) for state in ROUTER_STATES},
            "unknown_replicas": replicas["unknown_by_silence"],
        },
        "unhealthy_gpus": fleet["unhealthy_gpus"],
        "not_ready_nodes": fleet["not_ready_nodes"],
        "degraded_replicas": replicas["degraded_replicas"],
        "failed_replicas": replicas["failed_replicas"],
        "route_version": snap.route_version,
        "auth": snap.auth,
    }

"""LoRA adapters: objects of their own, served by the replicas of their base model that hold
them, loaded and unloaded as a pure step over one snapshot.

An adapter is routed as a model of its own whose endpoints are its holders, each under the id
`REPLICA@ADAPTER`: the router's table gives every (replica, adapter) pair a slot of its own, so
a request for an adapter goes only to a replica that holds it, by bounded-load affinity among
the holders, and the router's activity report carries last use, watch and requests in flight
per (replica, adapter) with no change to the router. Idle per (replica, adapter) then follows
the very rules of idle per replica (controlplane/vocabulary/idle.py): unknown is never idle.

| the fleet, for adapter A of base B                         | the step's answer                 |
|------------------------------------------------------------|-----------------------------------|
| requests wait for A, or fewer than `min_loaded` hold it    | load it on the Ready replica of B |
|                                                            | holding the fewest, with room     |
| every replica of B holds `max_adapters`                    | unload the adapter idle longest   |
|                                                            | past its `idle_after` (exact or   |
|                                                            | at least, nothing in flight,      |
|                                                            | priority not above A's), then A   |
| only adapters in use, unknown or young stand               | A waits; the reason names them    |
| A failed to load on a replica                              | not tried there again; shown      |
| A deleted                                                  | unloaded everywhere               |

An unload is a stop for the router: the holder leaves A's routes now, and the engine unloads A
only once every live router has dropped that route and has nothing in flight on it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from controlplane.vocabulary.idle import SLOT_SEP, IdleState
from controlplane.vocabulary.model import ModelSpec, Replica, ReplicaState
from controlplane.vocabulary.specs import (
    SpecError,
    format_duration,
    parse_idle_after,
    parse_name,
    parse_priority,
)

SEP = SLOT_SEP  # between a replica's id and an adapter's name; in neither
ADAPTER_FIELDS = {
    "kind", "name", "base", "source", "priority", "idle_after", "idle_after_s", "min_loaded",
    "generation",
}  # fmt: skip


@dataclass
class Adapter:
    name: str
    base: str
    source: str  # a path or URI the engine loads (vLLM's lora_path)
    priority: int = 0
    idle_after_s: float = 1800.0
    min_loaded: int = 0
    generation: int = 0

    def to_dict(self) -> dict:
        return {"kind": "adapter", **asdict(self)}

    @classmethod
    def from_dict(cls, body: dict) -> Adapter:
        return cls(**{k: v for k, v in body.items() if k != "kind"})


def slot_id(replica: str, adapter: str) -> str:
    return f"{replica}{SEP}{adapter}"


def split_slot(endpoint: str) -> tuple[str, str] | None:
    """(replica, adapter) of an adapter's endpoint id; None for a replica's own."""
    replica, sep, adapter = endpoint.partition(SEP)
    return (replica, adapter) if sep else None


def validate_adapter(body, specs: dict[str, ModelSpec]) -> Adapter:
    """An Adapter from an operator's mapping, or SpecError naming the first bad field."""
    if not isinstance(body, dict):
        raise SpecError("adapter", "expected a mapping")
    unknown = sorted(set(body) - ADAPTER_FIELDS)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known: {', '.join(sorted(ADAPTER_FIELDS))})")
    if body.get("kind", "adapter") != "adapter":
        raise SpecError("kind", "adapter")
    name = parse_name(body)
    if name in specs:
        raise SpecError("name", f"a model is named {name}: requests name one or the other")
    base = body.get("base")
    if not isinstance(base, str) or base not in specs:
        raise SpecError("base", f"no model {base!r}: apply the base model first")
    if not specs[base].max_adapters:
        raise SpecError("base", f"model {base} holds no adapters: give it max_adapters")
    source = body.get("source")
    if not isinstance(source, str) or not source or re.search(r"[\x00-\x1f]", source):
        raise SpecError("source", "required: a path or URI the engine loads the adapter from")
    priority = parse_priority(body)
    idle = parse_idle_after(body)
    min_loaded = body.get("min_loaded", 0)
    if isinstance(min_loaded, bool) or not isinstance(min_loaded, int) or min_loaded < 0:
        raise SpecError("min_loaded", "a non-negative integer")
    generation = body.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise SpecError("generation", "must be a non-negative integer")
    return Adapter(name, base, source, priority, idle, min_loaded, generation)


@dataclass(frozen=True)
class AdapterInputs:
    """What the step reads, all of it from one snapshot."""

    adapters: dict[str, Adapter]
    specs: dict[str, ModelSpec]
    replicas: list[Replica]
    waiting: dict[str, int]  # adapter -> requests routers hold for it
    idle: dict[str, tuple[float, IdleState]]  # keyed by slot_id(replica, adapter)
    in_flight: dict[str, int]  # keyed by slot_id(replica, adapter)


@dataclass
class AdapterPlan:
    loads: list[tuple[str, Replica]] = field(default_factory=list)  # (adapter, replica)
    unloads: list[tuple[str, Replica, str]] = field(default_factory=list)  # (adapter, r, why)
    reasons: dict[str, str] = field(default_factory=dict)  # adapter -> why it is not loaded


def held(replica: Replica) -> list[str]:
    """Adapters a replica holds or is told to: those it serves and those still unloading."""
    return [*replica.want_adapters, *replica.unloading]


def plan_adapters(inputs: AdapterInputs) -> AdapterPlan:
    plan = AdapterPlan()
    ready: dict[str, list[Replica]] = {}
    for r in inputs.replicas:
        if r.state == ReplicaState.READY:
            ready.setdefault(r.model, []).append(r)
    room = {r.id: len(held(r)) for rs in ready.values() for r in rs}
    for r in inputs.replicas:
        for name in r.want_adapters:
            if name not in inputs.adapters:
                plan.unloads.append((name, r, "adapter deleted"))
    # Replicas an unload makes room on: one of this plan, or one already under way (waiting
    # for routers to drop the route), which the next load there waits for.
    freeing = {r.id for rs in ready.values() for r in rs if r.unloading}
    order = sorted(
        inputs.adapters.values(),
        key=lambda a: (-a.priority, -inputs.waiting.get(a.name, 0), a.name),
    )
    for adapter in order:
        base = inputs.specs.get(adapter.base)
        replicas = ready.get(adapter.base, [])
        holders = [r for r in replicas if adapter.name in r.want_adapters]
        need = max(adapter.min_loaded, 1 if inputs.waiting.get(adapter.name) else 0)
        if len(holders) >= min(need, len(replicas)) or base is None:
            continue
        if not replicas:
            plan.reasons[adapter.name] = f"no Ready replica of {adapter.base}"
            continue
        candidates = [
            r
            for r in replicas
            if adapter.name not in r.want_adapters and adapter.name not in r.adapter_failures
        ]
        if not candidates:
            failures = "; ".join(
                f"{r.id}: {r.adapter_failures[adapter.name]}"
                for r in replicas
                if adapter.name in r.adapter_failures
            )
            plan.reasons[adapter.name] = f"failed to load: {failures}"
            continue
        with_room = [r for r in candidates if room[r.id] < base.max_adapters]
        if with_room:
            chosen = min(with_room, key=lambda r: (room[r.id], r.id))
            room[chosen.id] += 1
            plan.loads.append((adapter.name, chosen))
            continue
        if any(r.id in freeing for r in candidates):
            plan.reasons[adapter.name] = "waiting for an unload to finish"
            continue
        victim, blockers = _idlest(adapter, candidates, inputs)
        if victim is None:
            plan.reasons[adapter.name] = (
                f"every replica of {adapter.base} holds {base.max_adapters} adapters: "
                + "; ".join(blockers[:4])
            )
            continue
        name, replica, seconds, state = victim
        bound = "≥" if state == IdleState.AT_LEAST else ""
        plan.unloads.append(
            (name, replica, f"unloaded for {adapter.name}: idle {bound}{format_duration(seconds)}")
        )
        freeing.add(replica.id)
        plan.reasons[adapter.name] = f"waiting for {name} to unload from {replica.id}"
    _keep_a_slot_free(inputs, ready, room, freeing, plan)
    return plan


def _keep_a_slot_free(inputs, ready: dict, room: dict, freeing: set, plan: AdapterPlan) -> None:
    """A base whose engines load adapters themselves (`adapter_resolver`) keeps a slot free
    on each replica, for a request no holder can take at once to land on: a full replica
    gives up its adapter idle longest past its idle_after, as it would for a waiting one."""
    for base_name, replicas in ready.items():
        base = inputs.specs.get(base_name)
        if base is None or not base.adapter_resolver or not base.max_adapters:
            continue
        room_for = Adapter("a free slot", base_name, "", priority=1 << 30)
        for replica in replicas:
            if room[replica.id] < base.max_adapters or replica.id in freeing:
                continue
            victim, _ = _idlest(room_for, [replica], inputs)
            if victim is None:
                continue
            name, _, seconds, state = victim
            bound = "≥" if state == IdleState.AT_LEAST else ""
            why = f"a slot kept free for its engine: idle {bound}{format_duration(seconds)}"
            plan.unloads.append((name, replica, why))
            freeing.add(replica.id)


def _idlest(adapter: Adapter, candidates: list[Replica], inputs: AdapterInputs):
    """The loaded adapter idle longest past its own idle_after on one of `candidates`, that
    nothing waits for, nobody is using, of known use and of priority not above `adapter`'s;
    else None and what blocks."""
    best, blockers = None, []
    holders: dict[str, int] = {}
    for r in inputs.replicas:
        if r.state == ReplicaState.READY:
            for name in r.want_adapters:
                holders[name] = holders.get(name, 0) + 1
    for replica in candidates:
        for name in replica.want_adapters:
            other = inputs.adapters.get(name)
            if other is None:
                continue
            slot = slot_id(replica.id, name)
            seconds, state = inputs.idle.get(slot, (-1.0, IdleState.UNKNOWN))
            why = ""
            if other.priority > adapter.priority:
                why = f"priority {other.priority} above {adapter.name}'s"
            elif inputs.waiting.get(name):
                why = "requests wait for it"
            elif holders.get(name, 0) <= other.min_loaded:
                why = f"min_loaded {other.min_loaded} keeps it"
            elif state == IdleState.UNKNOWN:
                why = "use unknown"
            elif inputs.in_flight.get(slot):
                why = f"{inputs.in_flight[slot]} request(s) in flight"
            elif seconds < other.idle_after_s:
                kept = format_duration(other.idle_after_s)
                why = f"idle {format_duration(seconds)} of its {kept}"
            if why:
                blockers.append(f"{name} on {replica.id}: {why}")
                continue
            key = (seconds, name, replica.id)
            if best is None or key > best[0]:
                best = (key, (name, replica, seconds, state))
    return (best[1] if best else None), blockers

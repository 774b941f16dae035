"""Making room: which replicas a waiting model may take the GPUs of, as a pure step over one
snapshot, beside placement and scaling.

| the fleet, for the waiting model M                     | what happens                        |
|--------------------------------------------------------|-------------------------------------|
| M fits on free GPUs                                    | nothing to take: placement places it |
| GPUs of replicas nobody uses would make one placement   | the fewest GPUs that do are victims  |
| only replicas in use, unknown, young or not Ready stand | M waits: the reason names each one   |
| (Starting, Retiring, Stopping), or GPUs kept for another |                                     |
| waiting model, or a model with fewer Ready replicas than |                                     |
| it keeps                                                |                                     |
| only replicas protected for good stand (priority above  | final: M's requests are answered now |
| M's; their model at min_replicas with none to shed; M's  | (the reason names what blocks for    |
| own serving replicas), or M fits nowhere                 | good, nothing else)                  |

A replica on its way out passes, whoever's it is (M's own too: one that made way for another
model frees its GPUs all the same), and so does one of a model with more replicas than it
keeps (a scale-in sheds it): neither makes the answer final.

A victim is a Ready replica of another model whose idle state is `exact` or `at_least` (never
`unknown`), with no request in flight on any router, Ready for at least its model's
`min_residency`, whose model keeps at least its `min_replicas` Ready replicas without it (the
ones that exist, not the ones it should have) and whose priority is not above M's. Among the
sets of victims that free one placement of M (on one node; or whole nodes of one fabric for a
multi-node replica), the one with the fewest GPUs wins; then the one of the lowest
priorities; then the longest idle. Victims then go through the safe stop protocol
(controlplane/tick/steps/rooms.py and the executor's business, not this module's).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations

from controlplane.rules.held import awake_held_mb, holds_awake, holds_memory
from controlplane.rules.placement import eligible, fits_beside, hot_rate
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import HOLDING, ModelSpec, Node, Replica, ReplicaState, Slice
from controlplane.vocabulary.specs import format_duration as duration

# Beyond this many candidates on one node the exact search (every subset) gives way to a
# greedy one: a node holds a handful of replicas, so this is a bound, not a case.
EXACT_SEARCH_LIMIT = 12
# On its way out: its GPUs come free whatever else holds (once its process is gone: a Failed
# engine may still hold its memory), and its model already counts it gone.
LEAVING = {ReplicaState.RETIRING, ReplicaState.STOPPING, ReplicaState.FAILED}


@dataclass(frozen=True)
class Blocker:
    replica: str
    why: str
    permanent: bool  # holds for good (priority, min_replicas); else it may pass

    def __str__(self) -> str:
        return f"{self.replica}: {self.why}"


@dataclass
class RoomPlan:
    victims: list[Replica]  # empty with `placement` set: it fits as the fleet stands
    placement: list[Slice] | None  # the GPUs the victims free, to reserve for the model
    blockers: list[Blocker] = field(default_factory=list)
    final: bool = False  # no placement can ever be made for it by taking room

    @property
    def reason(self) -> str:
        if self.placement is not None:
            return ""
        if not self.blockers:
            return "no node could hold it even if emptied"
        shown = "; ".join(str(b) for b in self.blockers[:4])
        more = len(self.blockers) - 4
        return shown + (f"; and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class RoomInputs:
    """What the step reads, all of it from one snapshot."""

    nodes: list[Node]
    replicas: list[Replica]
    specs: dict[str, ModelSpec]
    desired: dict[str, int]  # model -> replicas it keeps now
    idle: dict[str, tuple[float, IdleState]]
    in_flight: dict[str, int]  # replica -> requests on it, summed over routers
    silent_holders: dict[str, str]  # replica -> a silent router that has it
    reserved: dict[tuple[str, int], str]  # GPU -> the waiting model it is kept for
    now: float
    default_residency_s: float
    rates: dict[str, float] = field(default_factory=dict)  # model -> requests a second

    @property
    def hot_rate(self) -> float:
        return hot_rate(self.rates, self.nodes)

    def is_hot(self, model: str) -> bool:
        """Above a card's fair share of the fleet's requests (rules/placement.py)."""
        return self.rates.get(model, 0.0) > self.hot_rate


def residency(spec: ModelSpec, default_s: float) -> float:
    return default_s if spec.min_residency_s is None else spec.min_residency_s


def ready_counts(replicas: list[Replica]) -> dict[str, int]:
    """model -> its Ready replicas: the ones that exist and serve."""
    counts: dict[str, int] = defaultdict(int)
    for r in replicas:
        if r.state == ReplicaState.READY:
            counts[r.model] += 1
    return counts


def kept_counts(replicas: list[Replica]) -> dict[str, int]:
    """model -> its replicas that hold GPUs and are not on their way out."""
    counts: dict[str, int] = defaultdict(int)
    for r in replicas:
        if r.state in HOLDING and r.state not in LEAVING:
            counts[r.model] += 1
    return counts


def may_lose_someday(specs: dict, desired: dict, kept: dict[str, int]) -> dict[str, int]:
    """model -> how many of its replicas may go some day: what it keeps above its floor, and
    whatever it has beyond what it keeps (a scale-in sheds those anyway)."""
    out = {}
    for name, spec in specs.items():
        should = desired.get(name, spec.replicas)
        out[name] = max(0, should - spec.floor) + max(0, kept.get(name, 0) - should)
    return out


def why_not(
    replica: Replica,
    waiting: ModelSpec,
    inputs: RoomInputs,
    ready: dict[str, int] | None = None,
    kept: dict[str, int] | None = None,
) -> Blocker | None:
    """None when `replica` may be taken for `waiting`, else what keeps it (on its own; the
    model-wide min_replicas limit is counted per set). `ready` and `kept`: ready_counts and
    kept_counts of the inputs."""
    spec = inputs.specs.get(replica.model)
    if spec is None:
        return Blocker(replica.id, "its model is being deleted", False)
    if replica.state in LEAVING:
        return Blocker(replica.id, f"{replica.state}, not Ready", False)
    if spec.priority > waiting.priority:
        return Blocker(
            replica.id, f"priority {spec.priority} above {waiting.name}'s {waiting.priority}", True
        )
    should = inputs.desired.get(spec.name, spec.replicas)
    if should <= spec.floor:
        kept = kept_counts(inputs.replicas) if kept is None else kept
        # for good only when its model has no replica to shed: a scale-in frees the rest
        for_good = kept.get(spec.name, 0) <= should
        return Blocker(replica.id, f"min_replicas {spec.floor} keeps it", for_good)
    if replica.state != ReplicaState.READY:
        return Blocker(replica.id, f"{replica.state}, not Ready", False)
    ready = ready_counts(inputs.replicas) if ready is None else ready
    if ready.get(spec.name, 0) <= spec.floor:
        return Blocker(
            replica.id,
            f"min_replicas {spec.floor}: {ready.get(spec.name, 0)} Ready, the others not yet",
            False,
        )
    rate = inputs.rates.get(spec.name, 0.0)
    if inputs.is_hot(spec.name) and rate > inputs.rates.get(waiting.name, 0.0):
        # Kept warm: its requests, more than the waiting model's, would wait for its wake.
        return Blocker(
            replica.id, f"busy: {rate:.2f} requests/s, more than {waiting.name}'s", False
        )
    seconds, state = inputs.idle.get(replica.id, (-1.0, IdleState.UNKNOWN))
    if state == IdleState.UNKNOWN:
        holder = inputs.silent_holders.get(replica.id)
        return Blocker(
            replica.id,
            f"use unknown: silent router {holder}" if holder else "use unknown: no live router",
            False,
        )
    if inputs.in_flight.get(replica.id, 0):
        n = inputs.in_flight[replica.id]
        return Blocker(replica.id, f"{n} request{'s' if n != 1 else ''} in flight", False)
    kept = residency(spec, inputs.default_residency_s)
    ready_for = inputs.now - replica.ready_at
    if ready_for < kept:
        return Blocker(
            replica.id, f"min_residency {duration(kept)}: Ready {duration(ready_for)}", False
        )
    return None


@dataclass(frozen=True)
class _Option:
    key: tuple
    victims: tuple[Replica, ...]
    placement: list[Slice]


def plan_room(waiting: ModelSpec, inputs: RoomInputs) -> RoomPlan:
    """The fewest GPUs to free for one replica of `waiting`, or why none can be freed."""
    held: dict[tuple[str, int], list[Replica]] = defaultdict(list)
    for r in inputs.replicas:
        if holds_awake(r):  # what sleeps holds a reserve: the sleep rules stop it if need be
            for piece in r.placement:
                for index in piece.gpus:
                    if holds_memory(r, piece.node):
                        held[(piece.node, index)].append(r)
    blockers: dict[str, Blocker] = {}
    takeable: dict[str, Replica] = {}
    ready, kept = ready_counts(inputs.replicas), kept_counts(inputs.replicas)
    for replica in {r.id: r for on in held.values() for r in on}.values():
        if replica.model == waiting.name:
            continue
        blocker = why_not(replica, waiting, inputs, ready, kept)
        if blocker is None:
            takeable[replica.id] = replica
        else:
            blockers[replica.id] = blocker
    # Now: a model keeps its min_replicas of the Ready replicas it has, and never goes below
    # what it should keep minus its floor. Some day: what it should keep, once all are Ready.
    should = {name: inputs.desired.get(name, spec.replicas) for name, spec in inputs.specs.items()}
    may_lose = {
        name: min(should[name], ready.get(name, 0)) - spec.floor
        for name, spec in inputs.specs.items()
    }

    def priority(replica: Replica) -> int:
        spec = inputs.specs.get(replica.model)
        return spec.priority if spec is not None else 0  # its model is being deleted

    def idle_s(replica: Replica) -> float:
        return inputs.idle.get(replica.id, (0.0, IdleState.UNKNOWN))[0]

    def search(may_take, limits, reserved) -> tuple[_Option | None, list[Blocker]]:
        find = _one_node if waiting.nodes_per_replica == 1 else _whole_nodes
        return find(waiting, inputs, held, may_take, limits, priority, idle_s, blockers, reserved)

    best, standing = search(lambda r: r.id in takeable, may_lose, inputs.reserved)
    if best is not None:
        return RoomPlan(list(best.victims), best.placement)

    # Could it ever fit by taking room? Only if what stands in the way may pass: replicas
    # young, busy, unknown or on their way in or out (its own too: a replica of the waiting
    # model that made way for another frees its GPUs all the same), and GPUs kept for another
    # model (its reservation ends, in a placement or an expiry).
    def may_pass(r: Replica) -> bool:
        if r.model == waiting.name:
            return r.state in LEAVING
        return r.id in takeable or (r.id in blockers and not blockers[r.id].permanent)

    someday, _ = search(may_pass, may_lose_someday(inputs.specs, inputs.desired, kept), {})
    ordered = sorted({b.replica: b for b in standing}.values(), key=lambda b: b.replica)
    return RoomPlan([], None, ordered, final=someday is None)


def _usable_gpus(node: Node, gpu_class: str) -> list[int]:
    return [g.index for g in node.gpus if g.gpu_class == gpu_class and g.healthy]


def _rate_of(inputs: RoomInputs):
    return lambda replica: inputs.rates.get(replica.model, 0.0)


def _set_key(victims, priority, idle_s, where: str, rate=lambda v: 0.0) -> tuple:
    gpus = sum(v.gpu_count for v in victims)
    priorities = sorted((priority(v) for v in victims), reverse=True)
    least_asked_first = round(sum(rate(v) for v in victims), 3)
    longest_idle_first = sorted(-idle_s(v) for v in victims)
    return (gpus, priorities, least_asked_first, longest_idle_first, where,
            sorted(v.id for v in victims))  # fmt: skip


def _within_limits(victims, may_lose) -> bool:
    """Whether each model keeps what it may not lose; a replica already leaving costs its
    model nothing more."""
    per_model: dict[str, int] = defaultdict(int)
    for v in victims:
        if v.state not in LEAVING:
            per_model[v.model] += 1
    return all(n <= may_lose.get(model, 0) for model, n in per_model.items())


def _one_node(waiting, inputs, held, may_take, may_lose, priority, idle_s, blockers, reserved):
    """The cheapest victims on one node after which `waiting` fits awake on enough of its
    cards beside what stays there (memory, not cards: a card keeps the occupants it can)."""
    need_gpus = waiting.gpus_per_replica
    best: _Option | None = None
    standing: list[Blocker] = []
    for node in sorted(inputs.nodes, key=lambda n: n.name):
        if not eligible(node):
            continue
        usable = _usable_gpus(node, waiting.gpu_class)
        if len(usable) < need_gpus:
            continue
        kept_for = {reserved[(node.name, i)] for i in usable if (node.name, i) in reserved}
        standing += [Blocker(node.name, f"GPUs kept for {m}", False) for m in sorted(kept_for)]
        cards = {g.index: g.memory_mb for g in node.gpus if g.index in usable
                 and (node.name, g.index) not in reserved}  # fmt: skip
        on_card = {i: held.get((node.name, i), []) for i in cards}
        awake = {i: sum(awake_held_mb(r, cards[i]) for r in on) for i, on in on_card.items()}

        def fitting(victims, cards=cards, on_card=on_card, awake=awake) -> list[int]:
            gone = {v.id for v in victims}
            return [
                i
                for i in sorted(cards)
                if fits_beside(
                    cards[i],
                    awake[i] - sum(awake_held_mb(r, cards[i]) for r in on_card[i]
                                   if r.id in gone),  # fmt: skip
                    waiting.gpu_memory_mb,
                )
            ]

        free = fitting(())
        if len(free) >= need_gpus:
            option = _Option((0,), (), [Slice(node.name, free[:need_gpus])])
            if best is None or option.key < best.key:
                best = option
            continue
        holders = {r.id: r for on in on_card.values() for r in on}
        candidates = [r for r in holders.values() if may_take(r)]
        standing += [blockers[rid] for rid in sorted(holders) if rid in blockers]
        for victims in _covering_sets(candidates, lambda vs: len(fitting(vs)) >= need_gpus):
            if not _within_limits(victims, may_lose):
                continue
            option = _Option(
                _set_key(victims, priority, idle_s, node.name, _rate_of(inputs)),
                tuple(victims),
                [Slice(node.name, fitting(victims)[:need_gpus])],
            )
            if best is None or option.key < best.key:
                best = option
    return best, standing


def _covering_sets(candidates, enough):
    """Sets of candidates after whose going `enough(set)` holds, none of them needless."""
    if len(candidates) > EXACT_SEARCH_LIMIT:
        ordered = sorted(candidates, key=lambda r: (-r.gpu_count, r.id))
        chosen = []
        for replica in ordered:
            if enough(chosen):
                break
            chosen.append(replica)
        if enough(chosen):
            yield chosen
        return
    for size in range(1, len(candidates) + 1):
        for victims in combinations(candidates, size):
            if enough(victims) and all(
                not enough([v for v in victims if v is not left]) for left in victims
            ):
                yield list(victims)


def _whole_nodes(waiting, inputs, held, may_take, may_lose, priority, idle_s, blockers, reserved):
    """Whole nodes of one fabric: per fabric, the nodes cheapest to empty, greedily (a victim
    spanning two of the chosen nodes counts once)."""
    by_fabric: dict[str, list[tuple[tuple, Node, list[Replica]]]] = defaultdict(list)
    standing: list[Blocker] = []
    for node in sorted(inputs.nodes, key=lambda n: n.name):
        if not eligible(node):
            continue
        usable = _usable_gpus(node, waiting.gpu_class)
        if len(usable) < waiting.gpus_per_replica or len(usable) != len(node.gpus):
            continue
        if any((node.name, g.index) in reserved for g in node.gpus):
            standing.append(Blocker(node.name, "GPUs kept for another model", False))
            continue
        holders = {r.id: r for g in node.gpus for r in held.get((node.name, g.index), ())}
        stuck = [rid for rid, r in holders.items() if not may_take(r)]
        if stuck:
            standing += [blockers[rid] for rid in stuck if rid in blockers]
            continue
        victims = sorted(holders.values(), key=lambda r: r.id)
        key = _set_key(victims, priority, idle_s, node.name, _rate_of(inputs))
        by_fabric[node.fabric].append((key, node, victims))
    best: _Option | None = None
    for fabric, options in sorted(by_fabric.items()):
        if len(options) < waiting.nodes_per_replica:
            continue
        chosen_nodes, victims = [], {}
        for _, node, node_victims in sorted(options, key=lambda o: o[0]):
            trial = {**victims, **{v.id: v for v in node_victims}}
            if not _within_limits(trial.values(), may_lose):
                continue
            victims = trial
            chosen_nodes.append(node)
            if len(chosen_nodes) == waiting.nodes_per_replica:
                break
        if len(chosen_nodes) < waiting.nodes_per_replica:
            continue
        placement = [
            Slice(n.name, _usable_gpus(n, waiting.gpu_class)[: waiting.gpus_per_replica])
            for n in sorted(chosen_nodes, key=lambda n: n.name)
        ]
        ordered = sorted(victims.values(), key=lambda r: r.id)
        key = _set_key(ordered, priority, idle_s, fabric, _rate_of(inputs))
        option = _Option(key, tuple(ordered), placement)
        if best is None or option.key < best.key:
            best = option
    return best, standing

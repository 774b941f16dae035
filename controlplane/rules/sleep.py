"""Sleeping engines: which replicas to put to sleep, wake or stop, as pure steps over one
snapshot, beside placement (placement.py) and making room (room.py).

A sleeping engine keeps its process and a small reserve of its cards' memory; at level 1 its
weights wait in its node's host memory. So a card holds one awake replica and any sleepers
whose reserves fit beside it, and a swap costs a wake instead of a cold start.

| the fleet, for model M                                  | the step's answer                  |
|---------------------------------------------------------|------------------------------------|
| a Ready replica of M idle past `sleep.after`, M above   | put it to sleep (`plan_idle`), if  |
| min_replicas, known use, nothing in flight, resident    | its node has the host memory       |
| a sleeper of M idle past `scale_to_zero_after`          | stop it (`plan_idle`)              |
| requests wait for M; a sleeper of M on cards nobody     | wake it (`plan_wake`)              |
| holds awake, its memory fits beside the other sleepers  |                                    |
| the same, but another replica is awake on those cards   | that one sleeps (or stops) first;  |
| and may be taken (room.py's victim rules)               | the cards are kept for the wake    |
| only replicas in use, unknown, young or protected stand | M waits; the reason names each one |
| a victim of making room whose model sleeps, its node    | it sleeps rather than stops        |
| with the host memory (`victim_moves`)                   |                                    |
| host memory short for that                              | a level-1 sleeper there stops      |
| an awake engine would not fit beside a card's sleepers  | sleepers there stop, the largest   |
| (`memory_stops`)                                        | reserve first: nobody uses them    |

Sleepers' idleness: nothing can route to a sleeper, so it stays as idle as it was when it fell
asleep, plus the time it has slept: a known lower bound, never `unknown`.

Memory is what each engine holds (controlplane/rules/held.py), never what its spec says now:
one told to sleep holds all of it until its agent says it sleeps, a sleeper wakes at the share
it was started with, and a plan counts its own stops against each model's min_replicas. A hot
model (rules/placement.py: above a card's fair share of the fleet's requests) is not put to
sleep for idleness; the least asked occupants make way first.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from controlplane.rules.held import (
    asleep_held_mb,
    awake_held_mb,
    holds_awake,
    holds_memory,
    holds_reserve,
)
from controlplane.rules.placement import eligible, fits_beside
from controlplane.rules.room import RoomInputs, residency, why_not
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import ModelSpec, Node, Replica, ReplicaState
from controlplane.vocabulary.specs import format_duration as duration

Gpu = tuple[str, int]


def holds_card(replica: Replica) -> bool:
    """Whether `replica`'s engine holds its awake memory (rules/held.py): from its start
    order until its agent says it sleeps or is gone; on its way to or out of sleep too."""
    return holds_awake(replica)


def is_sleeper(replica: Replica) -> bool:
    """A replica whose agent said it sleeps: it holds its reserve of its cards' memory."""
    return holds_reserve(replica)


def card_mb(nodes: dict[str, Node], gpu: Gpu) -> int:
    node = nodes.get(gpu[0])
    if node is None:
        return 0
    return next((g.memory_mb for g in node.gpus if g.index == gpu[1]), 0)


def reserve_of(replica: Replica, gpu: Gpu) -> int:
    """MiB `replica` keeps of `gpu` asleep: what it holds there once its agent said it sleeps,
    its reserve when a plan puts it to sleep."""
    if not holds_memory(replica, gpu[0]):
        return 0
    return asleep_held_mb(replica) if replica.asleep_held else max(1, replica.reserve_mb)


def awake_of(replica: Replica, nodes: dict[str, Node], gpu: Gpu) -> int:
    """MiB `replica` holds of `gpu` awake (0 once its process is gone from that node)."""
    if not holds_memory(replica, gpu[0]):
        return 0
    return awake_held_mb(replica, card_mb(nodes, gpu))


@dataclass
class Memory:
    """What engines hold of each card's memory (rules/held.py): sleepers their reserve
    (`reserve`), the rest all they hold (`awake`); and level-1 sleepers' host memory per node
    (MiB)."""

    reserve: dict[Gpu, int] = field(default_factory=lambda: defaultdict(int))
    sleepers_on: dict[Gpu, list[Replica]] = field(default_factory=lambda: defaultdict(list))
    host_used: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    awake: dict[Gpu, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, replica: Replica, spec: ModelSpec | None, nodes: dict[str, Node]) -> None:
        """`replica` asleep (or, in a plan, put to sleep)."""
        for gpu in gpus_of(replica):
            self.reserve[gpu] += reserve_of(replica, gpu)
            self.sleepers_on[gpu].append(replica)
            if spec is not None:
                self.host_used[gpu[0]] += spec.host_mb(card_mb(nodes, gpu))

    def add_awake(self, replica: Replica, nodes: dict[str, Node]) -> None:
        for gpu in gpus_of(replica):
            self.awake[gpu] += awake_of(replica, nodes, gpu)

    def remove_awake(self, replica: Replica, nodes: dict[str, Node]) -> None:
        for gpu in gpus_of(replica):
            self.awake[gpu] -= awake_of(replica, nodes, gpu)

    def used(self) -> dict[Gpu, int]:
        """MiB each card's engines hold, awake and asleep."""
        return {gpu: self.used_on(gpu) for gpu in self.reserve.keys() | self.awake.keys()}

    def used_on(self, gpu: Gpu) -> int:
        return self.reserve.get(gpu, 0) + self.awake.get(gpu, 0)

    def copy(self) -> Memory:
        copy = Memory()
        copy.reserve.update(self.reserve)
        copy.host_used.update(self.host_used)
        copy.awake.update(self.awake)
        copy.sleepers_on.update({gpu: list(on) for gpu, on in self.sleepers_on.items()})
        return copy

    def remove(self, replica: Replica, spec: ModelSpec | None, nodes: dict[str, Node]) -> None:
        for gpu in gpus_of(replica):
            self.reserve[gpu] -= reserve_of(replica, gpu)
            self.sleepers_on[gpu] = [r for r in self.sleepers_on[gpu] if r.id != replica.id]
            if spec is not None:
                self.host_used[gpu[0]] -= spec.host_mb(card_mb(nodes, gpu))


def gpus_of(replica: Replica) -> list[Gpu]:
    return [(piece.node, index) for piece in replica.placement for index in piece.gpus]


def memory_of(replicas: list[Replica], specs: dict[str, ModelSpec], nodes) -> Memory:
    """What every replica holds of its cards now, whether or not its model is still applied."""
    memory = Memory()
    for replica in replicas:
        if is_sleeper(replica):
            memory.add(replica, specs.get(replica.model), nodes)
        elif holds_card(replica):
            memory.add_awake(replica, nodes)
    return memory


def fits_awake(spec: ModelSpec, gpu: Gpu, nodes: dict[str, Node], used: int) -> bool:
    """Whether a new awake engine of `spec` fits on `gpu` beside `used` MiB of other engines."""
    return fits_beside(card_mb(nodes, gpu), used, spec.gpu_memory_mb)


def fits_woken(sleeper: Replica, gpu: Gpu, nodes: dict[str, Node], used: int) -> bool:
    """Whether `sleeper`, woken, fits on `gpu` beside `used` MiB of other engines: it takes
    the share it was started with again, whatever its spec says now."""
    card = card_mb(nodes, gpu)
    return fits_beside(card, used, awake_held_mb(sleeper, card) if sleeper.memory_share else None)


def host_short(replica: Replica, spec: ModelSpec, nodes: dict[str, Node], memory: Memory) -> dict:
    """node -> MiB of host memory missing for `replica` to sleep at its level ({}: it fits)."""
    short = {}
    for piece in replica.placement:
        node = nodes.get(piece.node)
        need = sum(spec.host_mb(card_mb(nodes, (piece.node, i))) for i in piece.gpus)
        if not need:
            continue
        total = node.host_memory_mb if node is not None else 0
        missing = memory.host_used[piece.node] + need - total
        if missing > 0:
            short[piece.node] = missing
    return short


def sleeper_idle(replica: Replica, now: float) -> float:
    """Seconds a sleeper has gone unused: as idle as when it fell asleep, plus its sleep."""
    return replica.idle_at_sleep + max(0.0, now - replica.slept_at)


@dataclass
class Move:
    replica: Replica | None  # None only for "blocked"
    action: str  # "sleep" | "stop" | "blocked": this plan cannot be made
    why: str


@dataclass
class SleepPlan:
    moves: list[Move] = field(default_factory=list)


def plan_idle(inputs: RoomInputs, woken_at: dict[str, float]) -> SleepPlan:
    """Replicas idle past their model's `sleep.after` go to sleep; sleepers idle past
    `scale_to_zero_after` stop. Neither takes a model below its min_replicas, nor touches a
    model that requests woke less than that long ago."""
    plan = SleepPlan()
    nodes = {n.name: n for n in inputs.nodes}
    memory = memory_of(inputs.replicas, inputs.specs, nodes)
    by_model: dict[str, list[Replica]] = defaultdict(list)
    for replica in inputs.replicas:
        by_model[replica.model].append(replica)
    for name, spec in sorted(inputs.specs.items()):
        mine = by_model.get(name, [])
        woke = woken_at.get(name)
        if spec.sleeps and spec.sleep_after_s is not None:
            if not (woke and inputs.now - woke < spec.sleep_after_s):
                plan.moves += _idle_sleeps(spec, mine, inputs, nodes, memory)
        if spec.scale_to_zero_after_s is not None:
            if not (woke and inputs.now - woke < spec.scale_to_zero_after_s):
                plan.moves += _sleeper_stops(spec, mine, inputs)
    return plan


def _idle_sleeps(spec, mine, inputs: RoomInputs, nodes, memory: Memory) -> list[Move]:
    ready = [r for r in mine if r.state == ReplicaState.READY]
    may = len(ready) - spec.floor
    if may <= 0:
        return []
    if inputs.is_hot(spec.name):
        return []  # kept warm: its next request is seconds away, whatever the last gap was
    candidates = []
    for replica in ready:
        seconds, state = inputs.idle.get(replica.id, (-1.0, IdleState.UNKNOWN))
        if state == IdleState.UNKNOWN or seconds < spec.sleep_after_s:
            continue
        if inputs.in_flight.get(replica.id, 0):
            continue
        if inputs.now - replica.ready_at < residency(spec, inputs.default_residency_s):
            continue
        candidates.append((seconds, replica))
    moves = []
    for seconds, replica in sorted(candidates, key=lambda c: (-c[0], c[1].id))[:may]:
        if host_short(replica, spec, nodes, memory):
            continue  # it stays awake; scale to zero may stop it later
        memory.remove_awake(replica, nodes)
        memory.add(replica, spec, nodes)
        bound = "≥" if inputs.idle[replica.id][1] == IdleState.AT_LEAST else ""
        moves.append(Move(replica, "sleep", f"idle {bound}{duration(seconds)}"))
    return moves


def _sleeper_stops(spec, mine, inputs: RoomInputs) -> list[Move]:
    may = inputs.desired.get(spec.name, spec.replicas) - spec.floor
    asleep = [r for r in mine if r.state == ReplicaState.ASLEEP and r.sleep]
    idle = sorted(((sleeper_idle(r, inputs.now), r) for r in asleep), key=lambda c: -c[0])
    return [
        Move(r, "stop", f"asleep and idle ≥{duration(seconds)}")
        for seconds, r in idle[: max(0, may)]
        if seconds >= spec.scale_to_zero_after_s
    ]


@dataclass
class WakePlan:
    replica: Replica | None  # the sleeper to wake (now, or once `moves` are done)
    moves: list[Move] = field(default_factory=list)  # what must sleep or stop first
    blockers: list[str] = field(default_factory=list)  # why no sleeper can wake yet
    final: bool = False  # what blocks every sleeper holds for good (priority, min_replicas)

    @property
    def now(self) -> bool:
        return self.replica is not None and not self.moves

    @property
    def reason(self) -> str:
        shown = "; ".join(self.blockers[:4])
        more = len(self.blockers) - 4
        return shown + (f"; and {more} more" if more > 0 else "")


def plan_wake(waiting: ModelSpec, inputs: RoomInputs, load: dict | None = None) -> WakePlan:
    """The sleeper of `waiting` cheapest to wake: one whose cards are free first, else one
    whose cards' awake occupants may be taken (put to sleep where they can, else stopped),
    fewest stops first, then the fewest moves, then the one whose cards are quietest (`load`:
    requests a second to what is awake on each card): a popular model wakes apart from
    the others; or why none can wake yet."""
    load = load or {}
    nodes = {n.name: n for n in inputs.nodes}
    specs = inputs.specs
    memory = memory_of(inputs.replicas, specs, nodes)
    holders: dict[Gpu, list[Replica]] = defaultdict(list)
    for r in inputs.replicas:
        if holds_card(r):
            for gpu in gpus_of(r):
                holders[gpu].append(r)
    sleepers = sorted(
        (
            r
            for r in inputs.replicas
            if r.model == waiting.name and r.state == ReplicaState.ASLEEP and r.sleep
        ),
        key=lambda r: (-r.slept_at, r.id),  # the most recent sleeper first: warmest caches
    )
    best: tuple[tuple, WakePlan] | None = None
    blockers: list[str] = []
    final = True
    for order, sleeper in enumerate(sleepers):
        plan = _wake_one(sleeper, waiting, inputs, nodes, memory, holders)
        if plan.replica is None:
            blockers += plan.blockers
            final = final and plan.final
            continue
        stops = sum(1 for m in plan.moves if m.action == "stop")
        busy = max((load.get(gpu, 0.0) for gpu in gpus_of(sleeper)), default=0.0)
        key = (stops, len(plan.moves), busy, order)
        if best is None or key < best[0]:
            best = (key, plan)
    if best is not None:
        return best[1]
    return WakePlan(None, blockers=sorted(set(blockers)), final=final)


def _wake_one(sleeper, waiting, inputs: RoomInputs, nodes, memory: Memory, holders) -> WakePlan:
    gpus = [(piece.node, i) for piece in sleeper.placement for i in piece.gpus]
    if any(g in inputs.reserved and inputs.reserved[g] != waiting.name for g in gpus):
        return WakePlan(None, blockers=[f"{sleeper.id}: its GPUs are kept for another model"])
    node_down = [p.node for p in sleeper.placement if not _usable(nodes.get(p.node))]
    if node_down:
        blocker = f"{sleeper.id}: node {node_down[0]} is not usable"
        return WakePlan(None, blockers=[blocker], final=True)
    trial = memory.copy()
    trial.remove(sleeper, inputs.specs.get(sleeper.model), nodes)

    def fits(used: Memory) -> bool:
        return all(fits_woken(sleeper, gpu, nodes, used.awake[gpu]) for gpu in gpus)

    planned: Counter = Counter()
    if fits(trial):
        # It fits beside what is awake there: only sleepers may have to make way.
        moves = memory_stops(waiting, gpus, inputs, trial, {sleeper.id}, planned, sleeper)
        if any(m.action == "blocked" for m in moves):
            blocked = [m.why for m in moves if m.action == "blocked"]
            return WakePlan(None, blockers=blocked, final=True)
        return WakePlan(sleeper, moves)
    occupants = {r.id: r for g in gpus for r in holders.get(g, ())}
    blockers, takeable, final = [], [], True
    for occupant in occupants.values():
        if occupant.model == waiting.name:
            blockers.append(f"{sleeper.id}: its cards serve {waiting.name} awake already")
            continue
        blocker = why_not(occupant, waiting, inputs)
        if blocker is None:
            takeable.append(occupant)
        else:
            blockers.append(str(blocker))
            final = final and blocker.permanent
    # The fewest occupants, the least asked and idlest first, whose memory makes it fit.
    victims, freed = [], trial.copy()
    takeable.sort(key=lambda r: (inputs.rates.get(r.model, 0.0),
                                 -inputs.idle.get(r.id, (0.0, None))[0], r.id))  # fmt: skip
    for occupant in takeable:
        if fits(freed):
            break
        freed.remove_awake(occupant, nodes)
        victims.append(occupant)
    if not fits(freed):
        return WakePlan(None, blockers=blockers, final=final)
    moves = victim_moves(victims, f"to wake {sleeper.id}", inputs, trial, planned)
    stops = memory_stops(waiting, gpus, inputs, trial, {sleeper.id}, planned, sleeper)
    moves = settled(moves + stops)
    if any(m.action == "blocked" for m in moves):
        blocked = [m.why for m in moves if m.action == "blocked"]
        return WakePlan(None, blockers=blocked, final=True)
    return WakePlan(sleeper, moves)


def settled(moves: list[Move]) -> list[Move]:
    """A victim planned to sleep whose reserve then had to go too simply stops."""
    stopped = {m.replica.id for m in moves if m.action == "stop" and m.replica is not None}
    return [m for m in moves if not (m.action == "sleep" and m.replica.id in stopped)]


def _usable(node: Node | None) -> bool:
    return node is not None and eligible(node)


def victim_moves(
    victims: list[Replica],
    purpose: str,
    inputs: RoomInputs,
    memory: Memory | None = None,
    planned: Counter | None = None,
) -> list[Move]:
    """What each victim of making room does: sleep where its model sleeps and its node has
    the host memory (a level-1 sleeper of another model on that node stopping for it, if need
    be), else stop. `memory` is updated with the sleeps planned; `planned` counts the stops
    per model, this plan's and those planned before it."""
    nodes = {n.name: n for n in inputs.nodes}
    if memory is None:
        memory = memory_of(inputs.replicas, inputs.specs, nodes)
    planned = Counter() if planned is None else planned
    moves: list[Move] = []
    for victim in victims:
        spec = inputs.specs.get(victim.model)
        if holds_card(victim):
            memory.remove_awake(victim, nodes)  # its cards' memory comes free, once it sleeps
        if spec is None or not spec.sleeps:
            planned[victim.model] += 1
            moves.append(Move(victim, "stop", f"stopped {purpose}"))
            continue
        short = host_short(victim, spec, nodes, memory)
        freeing = _host_freeing_stops(short, inputs, memory, nodes, planned) if short else []
        if short and freeing is None:
            planned[victim.model] += 1
            moves.append(Move(victim, "stop", f"stopped {purpose} (no host memory to sleep)"))
            continue
        for move in freeing or []:
            memory.remove(move.replica, inputs.specs.get(move.replica.model), nodes)
            moves.append(move)
        memory.add(victim, spec, nodes)
        moves.append(Move(victim, "sleep", f"put to sleep {purpose}"))
    return moves


def _host_freeing_stops(
    short: dict, inputs: RoomInputs, memory: Memory, nodes, planned: Counter
) -> list | None:
    """Level-1 sleepers to stop, longest idle first, so that `short` MiB of host memory come
    free on each node; None when they cannot. Each stop is counted in `planned` at once, so
    that the next one sees its model one fewer."""
    moves = []
    chosen: list[Replica] = []
    for node, missing in short.items():
        sleepers = {
            r.id: r
            for gpu, on in memory.sleepers_on.items()
            if gpu[0] == node
            for r in on
            if r.state == ReplicaState.ASLEEP
            and (spec := inputs.specs.get(r.model)) is not None
            and spec.sleep_level == 1
        }
        for sleeper in sorted(sleepers.values(), key=lambda r: -sleeper_idle(r, inputs.now)):
            if missing <= 0:
                break
            spec = inputs.specs[sleeper.model]
            if not _may_lose_one(spec, inputs, planned):
                continue
            freed = sum(
                spec.host_mb(card_mb(nodes, (p.node, i)))
                for p in sleeper.placement
                if p.node == node
                for i in p.gpus
            )
            planned[sleeper.model] += 1
            chosen.append(sleeper)
            moves.append(Move(sleeper, "stop", "stopped asleep to free host memory"))
            missing -= freed
        if missing > 0:
            for sleeper in chosen:  # not carried out: they count no more
                planned[sleeper.model] -= 1
            return None
    return moves


def _may_lose_one(spec: ModelSpec | None, inputs: RoomInputs, planned: Counter) -> bool:
    """Whether one more of `spec`'s replicas may stop, after the stops already planned; a
    deleted model's may always."""
    if spec is None:
        return True
    return inputs.desired.get(spec.name, spec.replicas) - planned[spec.name] > spec.floor


def memory_stops(
    spec: ModelSpec,
    gpus: list[Gpu],
    inputs: RoomInputs,
    memory: Memory,
    keep: frozenset | set = frozenset(),
    planned: Counter | None = None,
    woken: Replica | None = None,
) -> list[Move]:
    """Sleepers to stop, largest reserve first, so that an awake engine of `spec` (or
    `woken`, a sleeper of it, at the share it was started with) fits on each of `gpus`; a
    Move "blocked" when one cannot be (its model at min_replicas, counting the stops planned
    before, in `planned`)."""
    nodes = {n.name: n for n in inputs.nodes}
    planned = Counter() if planned is None else planned
    moves: list[Move] = []
    stopped: set[str] = set()

    def fits(gpu: Gpu) -> bool:
        used = memory.used_on(gpu)
        if woken is not None:
            return fits_woken(woken, gpu, nodes, used)
        return fits_awake(spec, gpu, nodes, used)

    for gpu in gpus:
        on = [r for r in memory.sleepers_on.get(gpu, []) if r.id not in keep]
        on.sort(key=lambda r: (-reserve_of(r, gpu), r.id))
        while not fits(gpu):
            if not on:
                moves.append(Move(None, "blocked", f"GPU {gpu[1]} on {gpu[0]} is too small"))
                return moves
            sleeper = on.pop(0)
            if sleeper.id in stopped:
                continue
            other = inputs.specs.get(sleeper.model)
            if not _may_lose_one(other, inputs, planned):
                why = f"{sleeper.id}: asleep, min_replicas {other.floor} keeps it"
                moves.append(Move(None, "blocked", why))
                return moves
            memory.remove(sleeper, other, nodes)
            stopped.add(sleeper.id)
            planned[sleeper.model] += 1
            moves.append(Move(sleeper, "stop", f"stopped asleep to make room for {spec.name}"))
    return moves

"""Placement as pure functions over a fleet snapshot: filter, score, pick; then reserve.

`Placer(nodes, held).place(spec, count)` never mutates its inputs. It places up to `count`
replicas, reserving as it goes so that no GPU is used twice (also across the models placed by
one Placer), and says in an operator's words why the rest could not be placed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from dataclasses import dataclass

from controlplane.vocabulary.model import ModelSpec, Node, Schedulable, Slice, awake_mb

# What a card shared by several engines keeps free of them all (CUDA contexts, fragmentation).
CARD_RESERVE_MB = 2048


@dataclass(frozen=True)
class Outcome:
    placements: list[list[Slice]]
    reason: str  # empty when every asked-for replica was placed


def eligible(node: Node) -> bool:
    return node.ready and node.schedulable == Schedulable.SCHEDULABLE


def free_gpus(
    node: Node,
    gpu_class: str,
    held: set[tuple[str, int]],
    used: dict[tuple[str, int], int] | None = None,
    gpu_memory_mb: int | None = None,
) -> list[int]:
    """Healthy, unheld GPUs of `gpu_class` on `node` where an engine taking `gpu_memory_mb`
    awake (None: the default share) fits beside the memory `used` there (MiB per card, awake
    engines and sleepers), by index: the emptiest first."""
    used = used or {}
    free = [
        g.index
        for g in node.gpus
        if g.gpu_class == gpu_class
        and g.healthy
        and (node.name, g.index) not in held
        and fits_beside(g.memory_mb, used.get((node.name, g.index), 0), gpu_memory_mb)
    ]
    return sorted(free, key=lambda i: (used.get((node.name, i), 0), i))


def fits_beside(card_mb: int, used: int, gpu_memory_mb: int | None) -> bool:
    """Whether an engine taking `gpu_memory_mb` awake (None: the default share) fits on a card
    of `card_mb` beside `used` MiB of other engines, awake or asleep. A shared card keeps
    CARD_RESERVE_MB free (CUDA contexts, fragmentation); an empty one takes any engine, and
    a card whose size is not known takes nothing beside what is on it."""
    if used <= 0:
        return True
    if card_mb <= 0:
        return False
    return used + awake_mb(card_mb, gpu_memory_mb) <= card_mb - CARD_RESERVE_MB


# Below this, no model is hot however its share compares: a request every ten seconds is no
# reason to give an engine a card of its own, nor to keep an idle one awake.
MIN_HOT_RATE = 0.1


def hot_rate(rates: dict[str, float], nodes) -> float:
    """The rate above which a model is hot: a card's fair share of the fleet's requests (its
    rate over its usable cards), and at least MIN_HOT_RATE; nothing is hot in an idle fleet."""
    cards = sum(len(n.gpus) for n in nodes if eligible(n))
    total = sum(rates.values())
    if not cards or total <= 0:
        return float("inf")
    return max(MIN_HOT_RATE, total / cards)


def place(spec: ModelSpec, count: int, nodes: list[Node], held: set[tuple[str, int]]) -> Outcome:
    """Place up to `count` replicas of `spec`; see Placer for placing many models at once."""
    return Placer(nodes, held).place(spec, count)


class Placer:
    """Placement for one reconcile tick. The capacity index of each GPU class (and engine
    size) is built once from the snapshot and shared by every model placed in the tick,
    reserving as it goes: a tick costs O(nodes + replicas), not O(models x nodes).

    `held`: cards taken whole (kept for a waiting model). `used`: MiB each card's engines
    hold (controlplane/rules/held.py). `load`: requests a second, over a recent window, to
    what is awake on each card (controlplane/vocabulary/rates.py). `rates`: each model's.

    A model is hot when its rate is above a card's fair share of the fleet's (the fleet's
    rate over its cards, `hot_rate`); a card is hot when what is awake on it is. Which card,
    for a replica of one GPU (never one that holds the same model):
    - a hot model: an empty card while there is one (the fullest node that has one, so that
      whole nodes stay free), since engines on one card share its compute; then the shared
      card with the least load: two hot models share a card only when every card is hot;
    - any other: the fullest shared card that is not hot (packed, so that memory stays whole
      elsewhere for a larger model and empty cards for the hot), then an empty card, then the
      least loaded.
    Several GPUs: the fullest node that fits, its emptiest cards first.
    """

    def __init__(
        self,
        nodes: list[Node],
        held: set[tuple[str, int]],
        used: dict[tuple[str, int], int] | None = None,
        load: dict[tuple[str, int], float] | None = None,
        models_on: dict[tuple[str, int], set[str]] | None = None,
        rates: dict[str, float] | None = None,
        awake: dict[tuple[str, int], int] | None = None,
    ) -> None:
        """`models_on`: the models each card already holds (a model's replicas go to cards
        apart, so that one card's fault takes one of them). `awake`: MiB each card's awake
        engines hold (None: all of `used`): a quiet model packs beside awake engines, not on
        a card that only sleepers hold, whose sleepers wake there."""
        self.nodes = nodes
        self.held = held
        self.used: dict[tuple[str, int], int] = {gpu: mb for gpu, mb in (used or {}).items()
                                                 if mb > 0}  # fmt: skip
        self.load = dict(load or {})  # grows with what this Placer places: a copy
        self.rates = rates or {}
        self.awake = self.used if awake is None else dict(awake)
        self.hot_rate = hot_rate(self.rates, nodes)
        # model -> the cards that hold it: a model's replicas go to cards apart
        self.cards_of: dict[str, set[tuple[str, int]]] = {}
        for gpu, models in (models_on or {}).items():
            for model in models:
                self.cards_of.setdefault(model, set()).add(gpu)
        self._by_class: dict[tuple[str, int | None], _Capacity] = {}

    def capacity(self, gpu_class: str, gpu_memory_mb: int | None = None) -> _Capacity:
        key = (gpu_class, gpu_memory_mb)
        if key not in self._by_class:
            self._by_class[key] = _Capacity(
                gpu_class, self.nodes, self.held, self.used, gpu_memory_mb, self.load,
                self.hot_rate, self.awake,
            )  # fmt: skip
        return self._by_class[key]

    def is_hot(self, model: str) -> bool:
        return self.rates.get(model, 0.0) > self.hot_rate

    def place(self, spec: ModelSpec, count: int) -> Outcome:
        capacity = self.capacity(spec.gpu_class, spec.gpu_memory_mb)
        placements: list[list[Slice]] = []
        for _ in range(count):
            if spec.nodes_per_replica == 1:
                avoid = self.cards_of.get(spec.name, frozenset())
                hot = self.is_hot(spec.name)
                chosen = capacity.pick_one_node(spec.gpus_per_replica, avoid, hot)
            else:
                chosen = capacity.pick_fabric_nodes(spec.gpus_per_replica, spec.nodes_per_replica)
            if chosen is None:
                return Outcome(placements, capacity.reason(spec, count - len(placements)))
            self._taken(capacity, spec, chosen)
            placements.append(chosen)
        return Outcome(placements, "")

    def _taken(self, capacity: _Capacity, spec: ModelSpec, chosen: list[Slice]) -> None:
        """Count what `chosen` now holds; engines of other sizes see those cards anew."""
        for piece in chosen:
            for index in piece.gpus:
                gpu = (piece.node, index)
                taken = max(1, awake_mb(capacity.card_mb[gpu], spec.gpu_memory_mb))
                self.used[gpu] = self.used.get(gpu, 0) + taken
                if self.awake is not self.used:
                    self.awake[gpu] = self.awake.get(gpu, 0) + taken
                self.cards_of.setdefault(spec.name, set()).add(gpu)
            capacity.readmit(piece.node, piece.gpus, self.used)
        # What it brings to its cards' load: its model's rate, shared by its replicas.
        replicas = max(1, len(self.cards_of.get(spec.name, ())))
        for piece in chosen:
            for index in piece.gpus:
                gpu = (piece.node, index)
                self.load[gpu] = self.load.get(gpu, 0.0) + self.rates.get(spec.name, 0.0) / replicas
        for key in [k for k, c in self._by_class.items() if k[0] == spec.gpu_class]:
            if self._by_class[key] is not capacity:
                del self._by_class[key]


class _Capacity:
    """Cards of one class that an engine of one size fits on, on eligible nodes, indexed so
    that each pick is cheap at 2,000 nodes: nodes bucketed by fitting count (each bucket
    sorted by name), whole free nodes by fabric (sorted by name), shared cards apart."""

    def __init__(
        self,
        gpu_class: str,
        nodes: list[Node],
        held: set[tuple[str, int]],
        used: dict[tuple[str, int], int] | None = None,
        gpu_memory_mb: int | None = None,
        load: dict[tuple[str, int], float] | None = None,
        hot_rate: float = float("inf"),
        awake: dict[tuple[str, int], int] | None = None,
    ) -> None:
        self.gpu_class = gpu_class
        self.gpu_memory_mb = gpu_memory_mb
        used = used or {}
        self.load = load if load is not None else {}
        self.hot_rate = hot_rate
        self.awake = used if awake is None else awake
        self.free: dict[str, list[int]] = {}
        self.size: dict[str, int] = {}
        self.fabric: dict[str, str] = {}
        self.card_mb: dict[tuple[str, int], int] = {}
        self.by_count: dict[int, list[str]] = defaultdict(list)
        # fabric -> node size -> names of the whole free nodes of that size, sorted
        self.whole: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
        # cards that something already uses and this engine still fits beside -> MiB used
        self.shared: dict[tuple[str, int], int] = {}
        self.empty = 0  # fitting cards nothing is on: once none is left, no search for one
        # The shared card with the most memory left that this engine still does not fit on:
        # (MiB left, card, node) for the reason.
        self.roomiest: tuple[int, int, str] | None = None
        self.of_class = self.usable = self.not_ready = self.cordoned = 0
        for node in sorted(nodes, key=lambda n: n.name):
            if not any(g.gpu_class == gpu_class for g in node.gpus):
                continue
            self.of_class += 1
            if not node.ready:
                self.not_ready += 1
            elif node.schedulable != Schedulable.SCHEDULABLE:
                self.cordoned += 1
            if not eligible(node):
                continue
            self.usable += 1
            for g in node.gpus:
                self.card_mb[(node.name, g.index)] = g.memory_mb
            free = free_gpus(node, gpu_class, held, used, gpu_memory_mb)
            self._note_roomiest(node, held, used, free)
            if not free:
                continue
            self.free[node.name] = free
            self.size[node.name] = len(node.gpus)
            self.fabric[node.name] = node.fabric
            self.by_count[len(free)].append(node.name)
            if len(free) == len(node.gpus):
                self.whole[node.fabric][len(node.gpus)].append(node.name)
            for index in free:
                if used.get((node.name, index), 0) > 0:
                    self.shared[(node.name, index)] = used[(node.name, index)]
                else:
                    self.empty += 1

    def _note_roomiest(self, node: Node, held, used, free: list[int]) -> None:
        for g in node.gpus:
            gpu = (node.name, g.index)
            if (g.gpu_class != self.gpu_class or not g.healthy or gpu in held or g.index in free
                    or g.memory_mb <= 0):  # fmt: skip
                continue
            left = g.memory_mb - CARD_RESERVE_MB - used.get(gpu, 0)
            if self.roomiest is None or left > self.roomiest[0]:
                self.roomiest = (left, g.index, node.name)

    def _set_free(self, name: str, free: list[int]) -> None:
        """`name`'s fitting cards are now `free`: its buckets follow."""
        before = self.free.get(name, [])
        if before:
            _remove(self.by_count[len(before)], name)
            if len(before) == self.size[name]:
                _remove(self.whole[self.fabric[name]][self.size[name]], name)
        self.free[name] = free
        if free:
            insort(self.by_count[len(free)], name)
            if len(free) == self.size[name]:
                insort(self.whole[self.fabric[name]][self.size[name]], name)

    def take(self, name: str, n: int, indexes: list[int] | None = None) -> Slice:
        """`n` of `name`'s cards: its first (emptiest) ones, or `indexes`."""
        free = self.free[name]
        taken = free[:n] if indexes is None else indexes
        self._set_free(name, [i for i in free if i not in taken])
        for index in taken:
            if self.shared.pop((name, index), None) is None:
                self.empty -= 1
        return Slice(name, taken)

    def readmit(self, name: str, indexes: list[int], used: dict[tuple[str, int], int]) -> None:
        """Cards just taken that an engine of this size still fits beside stay, shared."""
        back = [
            i for i in indexes
            if fits_beside(self.card_mb[(name, i)], used.get((name, i), 0), self.gpu_memory_mb)
        ]  # fmt: skip
        if not back:
            return
        for index in back:
            self.shared[(name, index)] = used[(name, index)]
        self._set_free(name, sorted(self.free.get(name, []) + back,
                                    key=lambda i: (self.shared.get((name, i), 0), i)))

    def pick_one_node(
        self, gpus: int, avoid: set[tuple[str, int]] | frozenset = frozenset(), hot: bool = False
    ) -> list[Slice] | None:
        """Cards on one node, none of them in `avoid` (those that hold this model already);
        `hot`: the model's rate is above a card's fair share (Placer's rules)."""
        if gpus == 1 and self.shared:
            shared = [g for g in self.shared if g not in avoid]
            quiet = [
                g for g in shared
                if self.load.get(g, 0.0) <= self.hot_rate and self.awake.get(g, 0) > 0
            ]  # fmt: skip
            if quiet and not hot:  # packed beside quiet engines, the fullest card first
                card = min(quiet, key=lambda g: (-self.shared[g], self.load.get(g, 0.0), g))
                return [self.take(card[0], 1, [card[1]])]
            empty = self._best_fit(1, avoid, empty_only=True) if self.empty else None
            if empty is not None:
                return empty
            card = min(shared, default=None,
                       key=lambda g: (self.load.get(g, 0.0), -self.shared[g], g))  # fmt: skip
            if card is not None:
                return [self.take(card[0], 1, [card[1]])]
        return self._best_fit(gpus, avoid)

    def _best_fit(self, gpus: int, avoid, empty_only: bool = False) -> list[Slice] | None:
        """The fullest node that fits, so that whole nodes stay free (the name breaks ties, so
        that the same snapshot always gives the same answer); its emptiest cards."""
        for count in sorted(self.by_count):
            if count < gpus:
                continue
            for name in self.by_count[count]:
                choice = [i for i in self.free[name] if (name, i) not in avoid
                          and not (empty_only and (name, i) in self.shared)][:gpus]  # fmt: skip
                if len(choice) == gpus:
                    return [self.take(name, gpus, choice)]
        return None

    def whole_count(self, fabric: str, gpus: int) -> int:
        return sum(len(names) for size, names in self.whole[fabric].items() if size >= gpus)

    def pick_fabric_nodes(self, gpus: int, need: int) -> list[Slice] | None:
        fitting = [
            (count, fabric)
            for fabric in self.whole
            if (count := self.whole_count(fabric, gpus)) >= need
        ]
        if not fitting:
            return None
        _, fabric = min(fitting)  # the fabric with the fewest whole nodes that still fits
        lists = [names for size, names in self.whole[fabric].items() if size >= gpus]
        chosen = lists[0][:need] if len(lists) == 1 else sorted(sum(lists, []))[:need]
        return [self.take(name, gpus) for name in chosen]

    def _memory_short(self, spec: ModelSpec) -> str:
        """Where memory, not cards, is what is short: the roomiest shared card, in MiB."""
        if self.roomiest is None:
            return ""
        left, index, name = self.roomiest
        card = self.card_mb[(name, index)]
        need = awake_mb(card, spec.gpu_memory_mb)
        return (
            f"; the roomiest shared card, {name}/{index}, has {max(0, left)} MiB free of {card}"
            f" (less {CARD_RESERVE_MB} kept), short by {need - max(0, left)} MiB"
        )

    def reason(self, spec: ModelSpec, missing: int) -> str:
        what = f"{missing} replica(s) of {spec.name} cannot be placed: "
        if not self.of_class:
            return what + f"no node has {spec.gpu_class} GPUs"
        excluded = []
        if self.not_ready:
            excluded.append(f"{self.not_ready} NotReady")
        if self.cordoned:
            excluded.append(f"{self.cordoned} cordoned or draining")
        aside = f" ({', '.join(excluded)})" if excluded else ""
        if spec.nodes_per_replica == 1:
            best = max((count for count, names in self.by_count.items() if names), default=0)
            return what + (
                f"needs {spec.gpus_per_replica} free {spec.gpu_class} GPUs on one "
                f"node; the best of {self.usable} usable node(s) has {best}{aside}"
            ) + self._memory_short(spec)
        whole = {
            f: count for f in self.whole if (count := self.whole_count(f, spec.gpus_per_replica))
        }
        if whole:
            fabric, free = max(whole.items(), key=lambda item: (item[1], item[0]))
            best = f"the best fabric ({fabric}) has {free} free"
        else:
            best = "no fabric has one free"
        return what + (
            f"needs {spec.nodes_per_replica} whole nodes of {spec.gpu_class} on "
            f"one fabric; {best}{aside}"
        )


def _remove(names: list[str], name: str) -> None:
    del names[bisect_left(names, name)]

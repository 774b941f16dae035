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
    reserve: dict[tuple[str, int], int] | None = None,
    gpu_memory_mb: int | None = None,
) -> list[int]:
    """Healthy, unheld GPUs of `gpu_class` on `node`, by index. With `reserve` (MiB kept by
    sleeping engines per GPU): only those where an awake engine taking `gpu_memory_mb` (None:
    the default share) fits beside them, the least reserved first."""
    reserve = reserve or {}
    free = [
        g.index
        for g in node.gpus
        if g.gpu_class == gpu_class
        and g.healthy
        and (node.name, g.index) not in held
        and fits_beside(g.memory_mb, reserve.get((node.name, g.index), 0), gpu_memory_mb)
    ]
    # Cards with the fewest sleepers first: sleepers spread over the cards, so that two
    # models wanted at once seldom need the same one awake.
    return sorted(free, key=lambda i: (reserve.get((node.name, i), 0), i))


def fits_beside(card_mb: int, reserve: int, gpu_memory_mb: int | None) -> bool:
    """Whether an engine taking `gpu_memory_mb` awake (None: the default share) fits on a
    card of `card_mb` beside `reserve` MiB of sleepers; a card whose size is not known takes
    no sleeper beside an awake engine."""
    if reserve <= 0:
        return True
    if card_mb <= 0:
        return False
    return awake_mb(card_mb, gpu_memory_mb) + reserve <= card_mb


def place(spec: ModelSpec, count: int, nodes: list[Node], held: set[tuple[str, int]]) -> Outcome:
    """Place up to `count` replicas of `spec`; see Placer for placing many models at once."""
    return Placer(nodes, held).place(spec, count)


class Placer:
    """Placement for one reconcile tick. The capacity index of each GPU class is built once
    from the snapshot and shared by every model placed in the tick, reserving as it goes: a
    tick costs O(nodes + replicas), not O(models x nodes)."""

    def __init__(
        self,
        nodes: list[Node],
        held: set[tuple[str, int]],
        reserve: dict[tuple[str, int], int] | None = None,
    ) -> None:
        """`reserve`: GPU -> MiB that sleeping engines keep on it (controlplane/sleep.py)."""
        self.nodes = nodes
        self.held = held
        self.reserve = {gpu: mb for gpu, mb in (reserve or {}).items() if mb > 0}
        self._by_class: dict[tuple[str, int | None], _Capacity] = {}

    def capacity(self, gpu_class: str, gpu_memory_mb: int | None = None) -> _Capacity:
        # Engines of different sizes see different free cards only where sleepers are.
        key = (gpu_class, gpu_memory_mb if self.reserve else None)
        if key not in self._by_class:
            self._by_class[key] = _Capacity(
                gpu_class, self.nodes, self.held, self.reserve, gpu_memory_mb
            )
        return self._by_class[key]

    def place(self, spec: ModelSpec, count: int) -> Outcome:
        capacity = self.capacity(spec.gpu_class, spec.gpu_memory_mb)
        placements: list[list[Slice]] = []
        for _ in range(count):
            if spec.nodes_per_replica == 1:
                chosen = capacity.pick_one_node(spec.gpus_per_replica)
            else:
                chosen = capacity.pick_fabric_nodes(spec.gpus_per_replica, spec.nodes_per_replica)
            if chosen is None:
                return Outcome(placements, capacity.reason(spec, count - len(placements)))
            placements.append(chosen)
        return Outcome(placements, "")


class _Capacity:
    """Free GPUs of one class on eligible nodes, indexed so that each pick is cheap at 2,000
    nodes: nodes bucketed by free count (each bucket sorted by name), whole free nodes by
    fabric (sorted by name)."""

    def __init__(
        self,
        gpu_class: str,
        nodes: list[Node],
        held: set[tuple[str, int]],
        reserve: dict[tuple[str, int], int] | None = None,
        gpu_memory_mb: int | None = None,
    ) -> None:
        self.gpu_class = gpu_class
        self.free: dict[str, list[int]] = {}
        self.size: dict[str, int] = {}
        self.fabric: dict[str, str] = {}
        self.by_count: dict[int, list[str]] = defaultdict(list)
        # fabric -> node size -> names of the whole free nodes of that size, sorted
        self.whole: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
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
            free = free_gpus(node, gpu_class, held, reserve, gpu_memory_mb)
            if not free:
                continue
            self.free[node.name] = free
            self.size[node.name] = len(node.gpus)
            self.fabric[node.name] = node.fabric
            self.by_count[len(free)].append(node.name)
            if len(free) == len(node.gpus):
                self.whole[node.fabric][len(node.gpus)].append(node.name)

    def take(self, name: str, n: int) -> Slice:
        free = self.free[name]
        _remove(self.by_count[len(free)], name)
        if len(free) == self.size[name]:
            _remove(self.whole[self.fabric[name]][self.size[name]], name)
        taken, rest = free[:n], free[n:]
        self.free[name] = rest
        if rest:
            insort(self.by_count[len(rest)], name)
        return Slice(name, taken)

    def pick_one_node(self, gpus: int) -> list[Slice] | None:
        # Best fit: the fullest node that fits, so that whole nodes stay free; the name breaks
        # ties so that the same snapshot always gives the same answer.
        for count in sorted(self.by_count):
            if count >= gpus and self.by_count[count]:
                return [self.take(self.by_count[count][0], gpus)]
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
            )
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

"""Placement as pure functions over a fleet snapshot: filter, score, pick; then reserve.

`place(spec, count, nodes, held)` never mutates its inputs. It places up to `count` replicas,
reserving as it goes so that no GPU is used twice, and says in an operator's words why the
rest could not be placed.
"""

from __future__ import annotations

from bisect import insort
from collections import defaultdict
from dataclasses import dataclass

from controlplane.model import ModelSpec, Node, Schedulable, Slice


@dataclass(frozen=True)
class Outcome:
    placements: list[list[Slice]]
    reason: str  # empty when every asked-for replica was placed


def eligible(node: Node) -> bool:
    return node.ready and node.schedulable == Schedulable.SCHEDULABLE


def free_gpus(node: Node, gpu_class: str, held: set[tuple[str, int]]) -> list[int]:
    """Healthy, unheld GPUs of `gpu_class` on `node`, by index."""
    return sorted(
        g.index
        for g in node.gpus
        if g.gpu_class == gpu_class and g.healthy and (node.name, g.index) not in held
    )


def is_whole_free(node: Node, gpu_class: str, held: set[tuple[str, int]]) -> bool:
    """Every GPU of the node is of `gpu_class`, healthy and unheld."""
    return bool(node.gpus) and len(free_gpus(node, gpu_class, held)) == len(node.gpus)


def place(spec: ModelSpec, count: int, nodes: list[Node], held: set[tuple[str, int]]) -> Outcome:
    capacity = _Capacity(spec, nodes, held)
    placements: list[list[Slice]] = []
    for _ in range(count):
        if spec.nodes_per_replica == 1:
            chosen = capacity.pick_one_node()
        else:
            chosen = capacity.pick_fabric_nodes()
        if chosen is None:
            taken = held | {(p.node, i) for placed in placements for p in placed for i in p.gpus}
            return Outcome(placements, _reason(spec, count - len(placements), nodes, taken))
        placements.append(chosen)
    return Outcome(placements, "")


class _Capacity:
    """Free GPUs of one class on eligible nodes, indexed so that each pick is cheap at 2,000
    nodes: nodes bucketed by free count (sorted by name), and whole free nodes by fabric."""

    def __init__(self, spec: ModelSpec, nodes: list[Node], held: set[tuple[str, int]]) -> None:
        self.spec = spec
        self.free: dict[str, list[int]] = {}
        self.by_count: dict[int, list[str]] = defaultdict(list)
        self.whole: dict[str, list[str]] = defaultdict(list)
        self.fabric: dict[str, str] = {}
        for node in sorted(nodes, key=lambda n: n.name):
            if not eligible(node):
                continue
            free = free_gpus(node, spec.gpu_class, held)
            if not free:
                continue
            self.free[node.name] = free
            self.fabric[node.name] = node.fabric
            self.by_count[len(free)].append(node.name)
            if len(free) == len(node.gpus) and len(free) >= spec.gpus_per_replica:
                self.whole[node.fabric].append(node.name)

    def take(self, name: str, n: int) -> Slice:
        free = self.free[name]
        self.by_count[len(free)].remove(name)
        if name in self.whole[self.fabric[name]]:
            self.whole[self.fabric[name]].remove(name)
        taken, rest = free[:n], free[n:]
        self.free[name] = rest
        if rest:
            insort(self.by_count[len(rest)], name)
        return Slice(name, taken)

    def pick_one_node(self) -> list[Slice] | None:
        # Best fit: the fullest node that fits, so that whole nodes stay free; the name breaks
        # ties so that the same snapshot always gives the same answer.
        for count in sorted(self.by_count):
            if count >= self.spec.gpus_per_replica and self.by_count[count]:
                return [self.take(self.by_count[count][0], self.spec.gpus_per_replica)]
        return None

    def pick_fabric_nodes(self) -> list[Slice] | None:
        need = self.spec.nodes_per_replica
        fitting = [
            (len(names), fabric) for fabric, names in self.whole.items() if len(names) >= need
        ]
        if not fitting:
            return None
        _, fabric = min(fitting)  # the fabric with the fewest whole nodes that still fits
        chosen = list(self.whole[fabric][:need])
        return [self.take(name, self.spec.gpus_per_replica) for name in chosen]


def _reason(spec: ModelSpec, missing: int, nodes: list[Node], held) -> str:
    of_class = [n for n in nodes if any(g.gpu_class == spec.gpu_class for g in n.gpus)]
    what = f"{missing} replica(s) of {spec.name} cannot be placed: "
    if not of_class:
        return what + f"no node has {spec.gpu_class} GPUs"
    usable = [n for n in of_class if eligible(n)]
    excluded = []
    not_ready = sum(1 for n in of_class if not n.ready)
    cordoned = sum(1 for n in of_class if n.ready and n.schedulable != Schedulable.SCHEDULABLE)
    if not_ready:
        excluded.append(f"{not_ready} NotReady")
    if cordoned:
        excluded.append(f"{cordoned} cordoned or draining")
    aside = f" ({', '.join(excluded)})" if excluded else ""
    if spec.nodes_per_replica == 1:
        best = max((len(free_gpus(n, spec.gpu_class, held)) for n in usable), default=0)
        return what + (
            f"needs {spec.gpus_per_replica} free {spec.gpu_class} GPUs on one node; "
            f"the best of {len(usable)} usable node(s) has {best}{aside}"
        )
    whole: dict[str, int] = defaultdict(int)
    for n in usable:
        if is_whole_free(n, spec.gpu_class, held) and len(n.gpus) >= spec.gpus_per_replica:
            whole[n.fabric] += 1
    if whole:
        fabric, free = max(whole.items(), key=lambda item: (item[1], item[0]))
        best = f"the best fabric ({fabric}) has {free} free"
    else:
        best = "no fabric has one free"
    return what + (
        f"needs {spec.nodes_per_replica} whole nodes of {spec.gpu_class} on one "
        f"fabric; {best}{aside}"
    )

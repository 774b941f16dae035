"""What the summary needs of one node, kept from one snapshot to the next.

At 16,000 nodes the summary's pass over 128,000 GPUs was most of its cost, yet between two
summaries almost no node changes. A node's shape (its fabric, readiness, schedulability and
GPU tallies per class) depends only on its GPU list, which a heartbeat replaces rather than
changes (controlplane/state/fleet.py), on `ready`, on `schedulable` and on the GPUs held on it; so a
shape is looked up by those and only worked out again when one of them moved. The summary then
counts shapes, not nodes: a fleet of identical nodes is a handful of shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.rules.placement import eligible

CAPACITY_KEYS = ("used", "free", "unavailable", "unhealthy", "total")
USED, FREE, UNAVAILABLE, UNHEALTHY, TOTAL = range(len(CAPACITY_KEYS))


def node_capacity(node, held) -> dict[str, list[int]]:
    """`node`'s GPUs per class, counted as CAPACITY_KEYS, with `held` the indexes held on it.
    This is the one place a card is classified, for the rows and for the summary alike."""
    by_class: dict[str, list[int]] = {}
    spare = FREE if eligible(node) else UNAVAILABLE
    for gpu in node.gpus:
        counts = by_class.get(gpu.gpu_class)
        if counts is None:
            counts = by_class[gpu.gpu_class] = [0, 0, 0, 0, 0]
        counts[TOTAL] += 1
        if not gpu.healthy:
            counts[UNHEALTHY] += 1
        elif gpu.index in held:
            counts[USED] += 1
        else:
            counts[spare] += 1
    return by_class


@dataclass(frozen=True, eq=False)  # one object per distinct shape (Shapes interns them)
class Shape:
    fabric: str
    ready: bool
    schedulable: str
    whole_free: bool
    tallies: tuple[tuple[str, tuple[int, ...]], ...]  # (GPU class, CAPACITY_KEYS counts)
    sick: bool  # some GPU of it is unhealthy


def shape_fields(node, held) -> tuple:
    """The fields of `node`'s Shape, in order."""
    by_class = node_capacity(node, held)
    whole_free = (
        eligible(node)
        and bool(node.gpus)
        and all(tally[FREE] == tally[TOTAL] for tally in by_class.values())
    )
    return (
        node.fabric,
        node.ready,
        str(node.schedulable),
        whole_free,
        tuple((gpu_class, tuple(tally)) for gpu_class, tally in sorted(by_class.items())),
        any(tally[UNHEALTHY] for tally in by_class.values()),
    )


class Shapes:
    """node name -> (the inputs its shape was worked out from, the shape). The GPU list is
    kept, so its identity cannot be handed to another list while the entry lives."""

    def __init__(self) -> None:
        self.known: dict[str, tuple] = {}
        self.interned: dict[tuple, Shape] = {}  # so that shapes count by identity, in C

    def of(self, node, held: frozenset[int]) -> Shape:
        entry = self.known.get(node.name)
        if (
            entry is not None
            and entry[0] is node.gpus
            and entry[1] == node.ready
            and entry[2] == node.schedulable
            and entry[3] == held
            and entry[4] == node.fabric
        ):
            return entry[5]
        fields = shape_fields(node, held)
        shape = self.interned.get(fields)
        if shape is None:
            shape = self.interned[fields] = Shape(*fields)
        self.known[node.name] = (node.gpus, node.ready, node.schedulable, held, node.fabric, shape)
        return shape

    def keep_only(self, names: int) -> None:
        """Forget removed nodes now and then: `names` is how many the fleet has now."""
        if len(self.known) > 2 * names + 100 or len(self.interned) > 2 * names + 100:
            self.known.clear()
            self.interned.clear()

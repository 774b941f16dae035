"""No card ever holds more than it has: the whole tick over random histories (apply, re-apply
at another size, delete mid-stream, scale, sleep, wake, a wake that never ends, an agent
restart, a node lost and back), against a model of what each engine process holds.

The oracle is the processes, not the tables: an engine holds the share of each card its
command was started with from the moment its agent starts it, its reserve only once it has
fallen asleep, all of it again from the moment it is told to wake, and everything until it
has exited. After every heartbeat and every tick:
- no card that holds two or more engines holds more than its size less the reserve kept on a
  shared card (placement.CARD_RESERVE_MB);
- the victim and min_replicas rules of test_tick_property hold (its World.check).
"""

import math
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.rules.placement import CARD_RESERVE_MB
from tests.controlplane.conftest import spec
from tests.controlplane.test_tick_property import World, play
from tests.controlplane.test_tick_property import run as tick_property_run

CARD_MB = 81559
NODES = ("n1", "n2")  # one card each: engines share cards early
MODELS = ("a", "b", "c")
SIZES = ("20GB", "30GB", "45GB", None)


@dataclass
class Engine:
    """One engine process on a node, as the GPU sees it."""

    gpus: list[int]
    share: float  # --gpu-memory-utilization it was started with
    reserve_mb: int
    phase: str = "awake"  # awake | sleeping | asleep | waking | stopping
    stuck: bool = False  # a wake that never finishes

    def held_mb(self) -> int:
        if self.phase == "asleep":
            return self.reserve_mb
        return math.ceil(self.share * CARD_MB)


class MemoryWorld(World):
    """test_tick_property's world, its agents replaced by engines that hold memory."""

    def __init__(self, directory: Path) -> None:
        self.engines: dict[str, dict[str, Engine]] = {name: {} for name in NODES}
        self.restarting: set[str] = set()
        self.reserves: dict[str, int] = {}
        super().__init__(directory, NODES, gpus=1)

    def heartbeats(self) -> None:
        for node in NODES:
            if node in self.partitioned or node not in self.fleet.nodes:
                continue
            if node in self.restarting:  # its agent is away for one beat, then adopts
                self.restarting.discard(node)
                continue
            self.beat(node)
            self.check_cards()

    def beat(self, node: str) -> None:
        engines = self.engines[node]
        reports = {}
        for i, (replica, engine) in enumerate(sorted(engines.items())):
            if replica in self.dead:
                reports[replica] = {"state": "Failed", "exit_code": -9}
                del engines[replica]  # it exited: it holds nothing
                continue
            if engine.phase == "stopping":
                reports[replica] = {"state": "Stopping"}
                continue
            if engine.phase == "sleeping":
                engine.phase = "asleep"  # it fell asleep since it was told
            elif engine.phase == "waking" and not engine.stuck:
                engine.phase = "awake"
            state = {"asleep": "Asleep", "waking": "Waking"}.get(engine.phase, "Ready")
            reports[replica] = {
                "state": state,
                "url": f"http://127.0.0.1:{9000 + i}",
                "gpu_memory_mb": engine.held_mb(),
            }
        assigned = {a["replica"]: a for a in self.fleet.heartbeat(node, {"replicas": reports})}
        # What was stopping at the last beat has exited by now.
        for replica in [r for r, e in engines.items() if e.phase == "stopping"]:
            if reports.get(replica, {}).get("state") == "Stopping":
                del engines[replica]
        for replica, engine in list(engines.items()):
            order = assigned.get(replica)
            if order is None:
                engine.phase = "stopping"
            elif order["sleep"] and engine.phase == "awake":
                engine.phase = "sleeping"
            elif not order["sleep"] and engine.phase in ("asleep", "sleeping"):
                engine.phase = "waking"  # it takes its memory back at once
        for replica, order in assigned.items():
            if replica in engines or replica in self.dead:
                continue
            reserve = self.fleet.specs[order["model"]].asleep_mb() if order["model"] in (
                self.fleet.specs) else 1024  # fmt: skip
            engines[replica] = Engine(
                list(order["gpus"]), float(order["gpu_memory_utilization"]), reserve
            )

    def check_cards(self) -> None:
        for node, engines in self.engines.items():
            on_card: dict[int, list[int]] = {}
            for engine in engines.values():
                for index in engine.gpus:
                    on_card.setdefault(index, []).append(engine.held_mb())
            for index, held in on_card.items():
                if len(held) > 1:
                    assert sum(held) <= CARD_MB - CARD_RESERVE_MB, (node, index, held)

    def tick(self, seconds: float) -> None:
        super().tick(seconds)
        self.check_cards()


def model_spec(draw, name):
    fields = {
        "replicas": draw(st.integers(0, 3)),
        "min_replicas": draw(st.sampled_from([0, 0, 1])),
        "min_residency": "5s",
        "scale_to_zero_after": "1m",
    }
    fields["min_replicas"] = min(fields["min_replicas"], fields["replicas"])
    size = draw(st.sampled_from(SIZES))
    if size is not None:
        fields["gpu_memory"] = size
    if draw(st.booleans()):
        fields.update(engine="vllm", sleep={"level": 1, "after": "15s", "wake_timeout": "20s"})
    return spec(name=name, **fields)


operations = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from([1.0, 3.0, 8.0, 20.0])),
    st.tuples(st.just("reapply"), st.sampled_from(MODELS), st.sampled_from(SIZES)),
    st.tuples(st.just("scale"), st.sampled_from(MODELS), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.sampled_from(MODELS)),
    st.tuples(st.just("stream"), st.integers(0, 1), st.sampled_from(MODELS)),
    st.tuples(st.just("stream_ends"), st.integers(0, 1)),
    st.tuples(st.just("wait"), st.integers(0, 1), st.sampled_from(MODELS), st.integers(0, 2)),
    st.tuples(st.just("stuck_wake"), st.integers(0, 5)),
    st.tuples(st.just("engine_dead"), st.integers(0, 5)),
    st.tuples(st.just("agent_restart"), st.sampled_from(NODES)),
    st.tuples(st.just("partition"), st.sampled_from(NODES)),
    st.tuples(st.just("heal"), st.sampled_from(NODES)),
)


@st.composite
def histories(draw):
    specs = [model_spec(draw, name) for name in MODELS]
    ops = draw(st.lists(operations, min_size=5, max_size=40))
    return specs, ops


def run(world: MemoryWorld, specs: dict, op: tuple) -> None:
    """This test's own operations; the rest as test_tick_property plays them."""
    kind = op[0]
    if kind == "reapply":
        body = dict(specs[op[1]])
        body.pop("gpu_memory", None)
        if op[2] is not None:
            body["gpu_memory"] = op[2]
        world.fleet.apply(body)
    elif kind in ("stuck_wake", "engine_dead"):
        running = sorted((r, e) for node in world.engines.values() for r, e in node.items())
        if running:
            replica, engine = running[op[1] % len(running)]
            if kind == "stuck_wake":
                engine.stuck = True
            else:
                world.dead.add(replica)
    elif kind == "agent_restart":
        world.restarting.add(op[1])
    else:
        tick_property_run(world, op)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_no_card_ever_holds_more_than_it_has(history):
    specs, ops = history
    by_name = {body["name"]: body for body in specs}
    play(MemoryWorld, specs, ops, lambda world, op: run(world, by_name, op))

"""Simulated fleets: many nodes of simulated GPUs, described in one YAML file.

    fabrics:
      - {name: ib-a, nodes: 4, gpu_class: H100-80GB, gpus_per_node: 8}
      - {name: ib-b, nodes: 2, gpu_class: A100-80GB, gpus_per_node: 8, host_memory_mb: 1048576}
    nodes:                       # optional, per node
      ib-a-0: {unhealthy_gpus: {3: "uncorrectable ECC"}, labels: {zone: a}}
    replicas: processes          # or in_process: no process a replica (sim/replicas.py)

Each node is a full agent in one process; only the GPUs are simulated, the replicas are real
engine processes (or, `in_process`, engines the agent serves itself, so that a fleet of
thousands of replicas fits on one machine). Faults (a GPU turning unhealthy, a node going
silent, a replica killed) can be injected while it runs, through sim/admin.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

MEMORY_MB = {"H100-80GB": 81559, "A100-80GB": 81920, "H200-141GB": 143771, "L40S-48GB": 46068}
DEFAULT_FLEET = {
    "fabrics": [
        {"name": "ib-a", "nodes": 2, "gpu_class": "H100-80GB", "gpus_per_node": 8},
        {"name": "ib-b", "nodes": 2, "gpu_class": "A100-80GB", "gpus_per_node": 4},
    ]
}


REPLICA_MODES = ("processes", "in_process")
ASLEEP_MB = 1024  # what a simulated engine keeps of a card asleep (CUDA context and graphs)


class FleetFileError(ValueError):
    pass


@dataclass
class SimInventory:
    """One simulated node: what NVML would have found, and the faults injected so far."""

    name: str
    address: str
    fabric: str
    gpu_class: str
    gpu_count: int
    memory_mb: int
    host_memory_mb: int = 0  # 0: twice the node's GPU memory, as a DGX-class node has
    labels: dict[str, str] = field(default_factory=dict)
    faults: dict[int, str] = field(default_factory=dict)
    replicas: str = "processes"  # or "in_process"
    # replica -> MiB its engine takes per card, set by fault injection; else what it was told
    memory_taken: dict[str, int] = field(default_factory=dict)
    # replica -> MiB each engine holds of each of its cards, as the cards granted it
    claims: dict[str, int] = field(default_factory=dict)
    refusals: list[dict] = field(default_factory=list)  # every allocation a card refused

    def describe(self) -> dict:
        return {
            "name": self.name,
            "address": self.address,
            "fabric": self.fabric,
            "labels": {**self.labels, "gpufleet.io/simulated": "true"},
            "host_memory_mb": self.host_memory_mb or 2 * self.memory_mb * self.gpu_count,
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-sim-{self.name}-{i}",
                    "gpu_class": self.gpu_class,
                    "memory_mb": self.memory_mb,
                }
                for i in range(self.gpu_count)
            ],
        }

    def replica_memory(self, running: dict) -> dict[str, int]:
        """What NVML would say each replica's engine takes of one card (MiB): the share it
        was told (vLLM's --gpu-memory-utilization takes just that), its reserve once it is
        asleep, unless a fault says more."""
        return {replica: self._held(replica, run) for replica, run in running.items()}

    def _held(self, replica: str, run) -> int:
        if replica in self.memory_taken:
            return self.memory_taken[replica]
        if getattr(run, "state", "") == "Asleep" and getattr(run, "sleep", 0):
            return ASLEEP_MB
        return int(run.memory_share * self.memory_mb)

    def refuse_over(self, running: dict, stopping: dict) -> list[tuple[str, str]]:
        """The engines this node's cards refuse, as a real card refuses an allocation past its
        memory: each engine that asks for more than it holds (a start, a wake) and would take a
        card past its size, in the order they asked. Returns (replica, why) for each; what
        they held stays with them until the agent has ended them. Every refusal is kept in
        `refusals`: no engine should ever meet one."""
        alive = {**stopping, **running}
        self.claims = {r: mb for r, mb in self.claims.items() if r in alive}
        refused = []
        for replica, run in sorted(running.items(), key=lambda item: item[1].started_at):
            want = self._held(replica, run)
            if want <= self.claims.get(replica, 0):
                self.claims[replica] = want  # it gave memory back (asleep)
                continue
            full = [
                (index, held)
                for index in getattr(run, "gpus", [])
                if (held := self._claimed_on(index, alive, but=replica)) + want > self.memory_mb
            ]
            if not full:
                self.claims[replica] = want
                continue
            index, held = full[0]
            why = (
                f"CUDA out of memory: tried to allocate {want} MiB on GPU {index} "
                f"({self.memory_mb} MiB) holding {held} MiB for other engines"
            )
            self.refusals.append({"replica": replica, "gpu": index, "why": why})
            refused.append((replica, why))
        return refused

    def _claimed_on(self, index: int, alive: dict, but: str) -> int:
        return sum(
            mb
            for replica, mb in self.claims.items()
            if replica != but and index in getattr(alive[replica], "gpus", [])
        )

    def health(self) -> list[dict]:
        return [
            {"index": i, "healthy": i not in self.faults, "reason": self.faults.get(i, "")}
            for i in range(self.gpu_count)
        ]


def _positive(entry: dict, key: str, where: str) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FleetFileError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def parse_fleet(data, address: str = "127.0.0.1") -> list[SimInventory]:
    if not isinstance(data, dict) or not isinstance(data.get("fabrics"), list):
        raise FleetFileError(
            "a fleet file needs `fabrics:`, a list of {name, nodes, gpu_class, gpus_per_node}"
        )
    unknown = set(data) - {"fabrics", "nodes", "address", "replicas"}
    if unknown:
        raise FleetFileError(f"unknown top-level key(s): {', '.join(sorted(unknown))}")
    address = str(data.get("address", address))
    replicas = data.get("replicas", "processes")
    if replicas not in REPLICA_MODES:
        raise FleetFileError(f"replicas: one of {', '.join(REPLICA_MODES)}, got {replicas!r}")
    nodes: list[SimInventory] = []
    for i, fabric in enumerate(data["fabrics"]):
        where = f"fabrics[{i}]"
        if not isinstance(fabric, dict):
            raise FleetFileError(f"{where}: expected a mapping")
        extra = set(fabric) - {
            "name",
            "nodes",
            "gpu_class",
            "gpus_per_node",
            "memory_mb",
            "host_memory_mb",
        }
        if extra:
            raise FleetFileError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        name, gpu_class = fabric.get("name"), fabric.get("gpu_class")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", name):
            raise FleetFileError(f"{where}: name must be lower-case letters, digits, '.', '-'")
        if not isinstance(gpu_class, str) or not gpu_class:
            raise FleetFileError(f"{where}: gpu_class is required, such as H100-80GB")
        count = _positive(fabric, "nodes", where)
        gpus = _positive(fabric, "gpus_per_node", where)
        memory = int(fabric.get("memory_mb") or MEMORY_MB.get(gpu_class, 0))
        host = fabric.get("host_memory_mb", 0)
        if isinstance(host, bool) or not isinstance(host, int) or host < 0:
            raise FleetFileError(f"{where}: host_memory_mb must be a non-negative integer (MiB)")
        nodes += [
            SimInventory(
                f"{name}-{n}", address, name, gpu_class, gpus, memory, host, replicas=replicas
            )
            for n in range(count)
        ]
    by_name = {n.name: n for n in nodes}
    overrides = data.get("nodes") or {}
    if not isinstance(overrides, dict):
        raise FleetFileError("nodes: expected a mapping of node name to overrides")
    for name, override in overrides.items():
        if name not in by_name:
            raise FleetFileError(f"nodes.{name}: no such node (nodes are named FABRIC-N)")
        node = by_name[name]
        for index, reason in (override.get("unhealthy_gpus") or {}).items():
            if not isinstance(index, int) or not 0 <= index < node.gpu_count:
                raise FleetFileError(f"nodes.{name}.unhealthy_gpus: no GPU {index!r}")
            node.faults[index] = str(reason)
        node.labels.update({str(k): str(v) for k, v in (override.get("labels") or {}).items()})
    return nodes


def load_fleet(path: str | None, address: str = "127.0.0.1") -> list[SimInventory]:
    if path is None:
        return parse_fleet(DEFAULT_FLEET, address)
    with open(path) as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise FleetFileError(f"{path}: not valid YAML: {exc}") from None
    return parse_fleet(data, address)

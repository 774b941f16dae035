"""The fleet's objects: nodes and their GPUs, model specs, replicas; and strict spec validation."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum

NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
PLACEHOLDERS = {"port", "model", "gpus", "replica", "rank", "nnodes", "master_addr", "host"}


class ReplicaState(StrEnum):
    PENDING = "Pending"  # placed, not yet started by its agent
    STARTING = "Starting"
    READY = "Ready"
    UNHEALTHY = "Unhealthy"
    RETIRING = "Retiring"  # idle, its route withdrawn: stopped once no router holds it
    STOPPING = "Stopping"
    FAILED = "Failed"


# States in which a replica holds its GPUs.
HOLDING = {
    ReplicaState.PENDING,
    ReplicaState.STARTING,
    ReplicaState.READY,
    ReplicaState.UNHEALTHY,
    ReplicaState.RETIRING,
    ReplicaState.STOPPING,
}


def gpu_faults(replica, nodes: dict) -> list[str]:
    """What is wrong with the GPUs `replica` holds, one line a GPU ([] when all are healthy)."""
    faults = []
    for piece in replica.placement:
        node = nodes.get(piece.node)
        if node is None:
            continue
        sick = {gpu.index: gpu for gpu in node.gpus if not gpu.healthy}
        if not sick:
            continue
        for index in piece.gpus:
            gpu = sick.get(index)
            if gpu is not None:
                faults.append(f"GPU {index} on {piece.node} unhealthy: {gpu.reason or 'no reason'}")
    return faults


class Schedulable(StrEnum):
    SCHEDULABLE = "schedulable"
    CORDONED = "cordoned"
    DRAINING = "draining"


@dataclass
class GPU:
    index: int
    uuid: str
    gpu_class: str
    memory_mb: int = 0
    healthy: bool = True
    reason: str = ""

    def copy(self) -> GPU:
        return GPU(self.index, self.uuid, self.gpu_class, self.memory_mb, self.healthy, self.reason)

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "gpu_class": self.gpu_class,
            "memory_mb": self.memory_mb,
            "healthy": self.healthy,
            "reason": self.reason,
        }


@dataclass
class Node:
    name: str
    address: str
    fabric: str
    gpus: list[GPU]
    labels: dict[str, str] = field(default_factory=dict)
    schedulable: Schedulable = Schedulable.SCHEDULABLE
    ready: bool = True
    last_heartbeat: float = 0.0  # control-plane monotonic clock, not persisted

    # Written out rather than dataclasses.asdict, which recurses through every field and
    # deep-copies each value: a snapshot of 16,000 nodes spent seconds there.
    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "address": self.address,
            "fabric": self.fabric,
            "gpus": [gpu.to_dict() for gpu in self.gpus],
            "labels": dict(self.labels),
            "schedulable": str(self.schedulable),
            "ready": self.ready,
        }

    def copy(self) -> Node:
        """A copy that shares the GPU list: the fleet never changes one in place (a heartbeat
        that changes a GPU's health gives the node a new list), so a snapshot of 16,000 nodes
        copies 16,000 objects, not 144,000."""
        return Node(
            self.name,
            self.address,
            self.fabric,
            self.gpus,
            dict(self.labels),
            self.schedulable,
            self.ready,
            self.last_heartbeat,
        )

    @classmethod
    def from_dict(cls, body: dict) -> Node:
        gpus = [GPU(**gpu) for gpu in body["gpus"]]
        return cls(
            name=body["name"],
            address=body["address"],
            fabric=body["fabric"],
            gpus=gpus,
            labels=dict(body.get("labels") or {}),
            schedulable=Schedulable(body.get("schedulable", "schedulable")),
            ready=bool(body.get("ready", True)),
        )


@dataclass
class ModelSpec:
    name: str
    gpu_class: str
    command: list[str]
    gpus_per_replica: int = 1
    nodes_per_replica: int = 1
    replicas: int = 1
    env: dict[str, str] = field(default_factory=dict)
    # variable -> {"file": PATH} or {"agent_env": NAME}: read on the node, never stored here
    env_from: dict[str, dict[str, str]] = field(default_factory=dict)
    health_path: str = "/health"
    idle_after_s: float = 1800.0
    generation: int = 0
    min_replicas: int | None = None  # None: `replicas`, never scaled down on idle
    scale_to_zero_after_s: float | None = None  # idle this long: scaled towards min_replicas
    affinity: str | None = None  # off | session | prefix; None: each router's --affinity
    priority: int = 0  # a waiting model may take room from models of its priority or lower
    min_residency_s: float | None = None  # Ready this long before it may be taken; None: server's
    max_replicas: int | None = None  # None: `replicas`
    target_in_flight: float | None = None  # set: autoscaled on load, this many per replica
    scale_down_delay_s: float = 300.0  # lower for this long before scaling in

    def to_dict(self) -> dict:
        return asdict(self)

    def copy(self) -> ModelSpec:
        return replace(
            self,
            command=list(self.command),
            env=dict(self.env),
            env_from={name: dict(source) for name, source in self.env_from.items()},
        )

    @property
    def floor(self) -> int:
        """The fewest replicas idleness (or a light load) may leave running."""
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def ceiling(self) -> int:
        """The most replicas load may ask for."""
        return self.replicas if self.max_replicas is None else self.max_replicas

    @property
    def autoscaled(self) -> bool:
        return self.target_in_flight is not None


@dataclass
class Slice:
    """The GPUs of one node that a replica holds."""

    node: str
    gpus: list[int]


@dataclass
class Replica:
    id: str
    model: str
    placement: list[Slice]
    state: ReplicaState = ReplicaState.PENDING
    reason: str = ""
    url: str = ""
    created_at: float = 0.0  # wall clock, for operators
    updated_at: float = 0.0
    exit_code: int | None = None
    log_tail: str = ""
    ready_at: float = 0.0  # wall clock: when it last turned Ready (min_residency counts from it)

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpus) for s in self.placement)

    @property
    def nodes(self) -> list[str]:
        return [s.node for s in self.placement]

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "model": self.model,
            "placement": [{"node": s.node, "gpus": list(s.gpus)} for s in self.placement],
            "state": str(self.state),
            "reason": self.reason,
            "url": self.url,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "exit_code": self.exit_code,
            "log_tail": self.log_tail,
            "ready_at": self.ready_at,
        }

    def copy(self) -> Replica:
        return Replica(
            self.id,
            self.model,
            [Slice(s.node, list(s.gpus)) for s in self.placement],
            self.state,
            self.reason,
            self.url,
            self.created_at,
            self.updated_at,
            self.exit_code,
            self.log_tail,
            self.ready_at,
        )

    @classmethod
    def from_dict(cls, body: dict) -> Replica:
        return cls(
            **{
                **body,
                "placement": [Slice(**s) for s in body["placement"]],
                "state": ReplicaState(body["state"]),
            }
        )


class SpecError(ValueError):
    """A spec was refused; `field` names what is wrong."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


SPEC_FIELDS = {
    "name",
    "gpu_class",
    "command",
    "gpus_per_replica",
    "nodes_per_replica",
    "replicas",
    "env",
    "env_from",
    "health_path",
    "idle_after",
    "idle_after_s",
    "generation",
    "min_replicas",
    "scale_to_zero_after",
    "scale_to_zero_after_s",
    "affinity",
    "priority",
    "min_residency",
    "min_residency_s",
    "max_replicas",
    "target_in_flight",
    "scale_down_delay",
    "scale_down_delay_s",
}
PRIORITY_RANGE = (-1_000_000, 1_000_000)
AFFINITY_MODES = ("off", "session", "prefix")


def format_duration(seconds: float) -> str:
    """90 -> 90s, 120 -> 2m, 7200 -> 2h: the shortest exact unit."""
    seconds = int(round(seconds))
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def parse_duration(value, field_name: str, allow_zero: bool = False) -> float:
    """Seconds from a number or a string like 90s, 30m, 2h."""
    if isinstance(value, bool):
        raise SpecError(field_name, "expected a duration such as 30m")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?[smhd]?", value.strip()):
        text = value.strip()
        unit = text[-1] if text[-1] in "smhd" else "s"
        number = float(text.rstrip("smhd"))
        seconds = number * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    else:
        raise SpecError(field_name, f"expected a duration such as 30m, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise SpecError(field_name, "must not be negative" if allow_zero else "must be positive")
    return seconds


def _positive_int(body: dict, name: str, default: int, allow_zero: bool = False) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(name, f"expected an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise SpecError(name, "must be positive" if not allow_zero else "must not be negative")
    return value


def validate_spec(body) -> ModelSpec:
    """A ModelSpec from an operator's mapping, or SpecError naming the first bad field."""
    if not isinstance(body, dict):
        raise SpecError("spec", "expected a mapping")
    unknown = sorted(set(body) - SPEC_FIELDS)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known: {', '.join(sorted(SPEC_FIELDS))})")
    name = body.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise SpecError(
            "name",
            "lower-case letters, digits, '.', '_' or '-', 1-63 characters, "
            "starting and ending with a letter or digit",
        )
    gpu_class = body.get("gpu_class")
    if not isinstance(gpu_class, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", gpu_class):
        raise SpecError("gpu_class", "required, such as H100-80GB")
    command = body.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise SpecError(
            "command", "must be a non-empty list of strings (an argv, never a shell line)"
        )
    for arg in command:
        for placeholder in re.findall(r"\{([^{}]*)\}", arg):
            if placeholder not in PLACEHOLDERS:
                raise SpecError(
                    "command",
                    f"unknown placeholder {{{placeholder}}}; known: "
                    + ", ".join(sorted(PLACEHOLDERS)),
                )
    env = body.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str)
        for k, v in env.items()
    ):
        raise SpecError("env", "must map variable names to strings")
    env_from = body.get("env_from") or {}
    if not isinstance(env_from, dict):
        raise SpecError("env_from", "must map variable names to {file: PATH} or {agent_env: NAME}")
    for variable, source in env_from.items():
        if not isinstance(variable, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
            raise SpecError("env_from", f"{variable!r} is not a variable name")
        if (
            not isinstance(source, dict)
            or len(source) != 1
            or next(iter(source)) not in ("file", "agent_env")
            or not isinstance(next(iter(source.values())), str)
            or not next(iter(source.values()))
        ):
            raise SpecError(
                f"env_from.{variable}", "one of {file: PATH} or {agent_env: NAME}, a string"
            )
        if variable in env:
            raise SpecError(f"env_from.{variable}", "also set in env: give it in one place")
    health_path = body.get("health_path", "/health")
    if not isinstance(health_path, str) or not health_path.startswith("/"):
        raise SpecError("health_path", "must be a path starting with /")
    if "idle_after" in body and "idle_after_s" in body:
        raise SpecError("idle_after", "give idle_after or idle_after_s, not both")
    idle = body.get("idle_after", body.get("idle_after_s", 1800))
    generation = body.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise SpecError("generation", "must be a non-negative integer")
    replicas = _positive_int(body, "replicas", 1, allow_zero=True)
    min_replicas = None
    if body.get("min_replicas") is not None:
        min_replicas = _positive_int(body, "min_replicas", 0, allow_zero=True)
        if min_replicas > replicas:
            raise SpecError("min_replicas", f"must not exceed replicas ({replicas})")
    if "scale_to_zero_after" in body and "scale_to_zero_after_s" in body:
        raise SpecError("scale_to_zero_after", "give scale_to_zero_after or _s, not both")
    scale_after = body.get("scale_to_zero_after", body.get("scale_to_zero_after_s"))
    if scale_after is not None:
        scale_after = parse_duration(scale_after, "scale_to_zero_after")
    max_replicas = None
    if body.get("max_replicas") is not None:
        max_replicas = _positive_int(body, "max_replicas", 0, allow_zero=True)
        if max_replicas < replicas:
            raise SpecError("max_replicas", f"must be at least replicas ({replicas})")
    target = body.get("target_in_flight")
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, int | float) or target <= 0
    ):
        raise SpecError("target_in_flight", f"a positive number of requests, got {target!r}")
    if target is None and max_replicas is not None and max_replicas > replicas:
        raise SpecError(
            "target_in_flight", "required with max_replicas above replicas: it is what scales"
        )
    if "scale_down_delay" in body and "scale_down_delay_s" in body:
        raise SpecError("scale_down_delay", "give scale_down_delay or _s, not both")
    delay = body.get("scale_down_delay", body.get("scale_down_delay_s", 300))
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise SpecError("priority", f"expected an integer, got {priority!r}")
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise SpecError("priority", "must be between -1000000 and 1000000")
    if "min_residency" in body and "min_residency_s" in body:
        raise SpecError("min_residency", "give min_residency or min_residency_s, not both")
    residency = body.get("min_residency", body.get("min_residency_s"))
    if residency is not None:
        residency = parse_duration(residency, "min_residency", allow_zero=True)
    affinity = body.get("affinity")
    if affinity is False:  # YAML 1.1 reads a bare `off` as false
        affinity = "off"
    if affinity is not None and affinity not in AFFINITY_MODES:
        raise SpecError("affinity", f"one of {', '.join(AFFINITY_MODES)}")
    return ModelSpec(
        name=name,
        gpu_class=gpu_class,
        command=list(command),
        gpus_per_replica=_positive_int(body, "gpus_per_replica", 1),
        nodes_per_replica=_positive_int(body, "nodes_per_replica", 1),
        replicas=replicas,
        env=dict(env),
        env_from={k: dict(v) for k, v in env_from.items()},
        health_path=health_path,
        idle_after_s=parse_duration(idle, "idle_after"),
        generation=generation,
        min_replicas=min_replicas,
        scale_to_zero_after_s=scale_after,
        affinity=affinity,
        priority=priority,
        min_residency_s=residency,
        max_replicas=max_replicas,
        target_in_flight=None if target is None else float(target),
        scale_down_delay_s=parse_duration(delay, "scale_down_delay"),
    )

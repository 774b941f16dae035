"""The fleet's objects: nodes and their GPUs, model specs, replicas (their validation: specs.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum


class ReplicaState(StrEnum):
    PENDING = "Pending"  # placed, not yet started by its agent
    STARTING = "Starting"
    READY = "Ready"
    UNHEALTHY = "Unhealthy"
    RETIRING = "Retiring"  # idle, its route withdrawn: stopped once no router holds it
    STOPPING = "Stopping"
    FAILED = "Failed"
    SLEEPING = "Sleeping"  # its route withdrawn, then its engine told to sleep
    ASLEEP = "Asleep"  # its process kept, its GPUs' memory given back but for a small reserve
    WAKING = "Waking"  # its engine told to wake: Ready once its health answers again


# States in which a replica holds its GPUs.
HOLDING = {
    ReplicaState.PENDING,
    ReplicaState.STARTING,
    ReplicaState.READY,
    ReplicaState.UNHEALTHY,
    ReplicaState.RETIRING,
    ReplicaState.STOPPING,
    ReplicaState.SLEEPING,
    ReplicaState.WAKING,
}
# States in which a replica's process runs on its node: it holds its cards, or (Asleep) a
# reserve of their memory and, at level 1, host memory for its weights.
RESIDENT = HOLDING | {ReplicaState.ASLEEP}
ENGINE_KINDS = ("vllm", "sglang", "llama.cpp")
# Engines that sleep on their own and wake on the next request (llama.cpp's
# --sleep-idle-seconds): the fleet never tells them to; asleep, they are Ready all the same.
SELF_WAKING = ("llama.cpp",)


# An engine over its gpu_memory by more than this share starves the engines beside it.
MEMORY_TOLERANCE = 0.05


def memory_over(used_mb: int, allowed_mb: int, asleep: bool = False) -> str:
    """Why an engine holding `used_mb` of a card is over what it was started with (or, asleep,
    its reserve) ("" if not)."""
    if used_mb <= 0 or allowed_mb <= 0 or used_mb <= allowed_mb * (1 + MEMORY_TOLERANCE):
        return ""
    over = 100 * (used_mb - allowed_mb) // allowed_mb
    what = "its asleep reserve" if asleep else "its gpu_memory"
    return (
        f"its engine holds {used_mb} MiB of a card, {over}% over {what} "
        f"({allowed_mb} MiB): it would starve its neighbours"
    )


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
    host_memory_mb: int = 0  # MiB, as the agent found it (/proc/meminfo); 0: not known
    heartbeat_s: float = 0.0  # the period its agent was last told (controlplane/rules/pacing.py)

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
            "host_memory_mb": self.host_memory_mb,
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
            self.host_memory_mb,
            self.heartbeat_s,
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
            host_memory_mb=int(body.get("host_memory_mb") or 0),
        )


def awake_mb(card_mb: int, gpu_memory_mb: int | None) -> int:
    """GPU memory an engine takes awake: what its spec says, else vLLM's default share of the
    card (0.9)."""
    return gpu_memory_mb if gpu_memory_mb is not None else int(card_mb * 0.9)


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
    # set: also out when the engines' own queues hold more than this per Ready replica
    target_waiting: float | None = None
    scale_down_delay_s: float = 300.0  # lower for this long before scaling in
    # Sleeping engines (controlplane/rules/sleep.py). Memory in MiB per GPU, as NVML counts it;
    # None: the default from the card (see `awake_mb`, `asleep_mb`, `host_mb`).
    engine: str | None = None  # vllm | sglang | llama.cpp | custom; None: no sleep API
    engine_endpoints: dict[str, str] = field(default_factory=dict)  # custom: sleep/wake/asleep
    sleep_level: int | None = None  # 1: weights kept in host memory; 2: dropped
    sleep_after_s: float | None = None  # idle this long: put to sleep
    wake_timeout_s: float = 120.0  # not Ready this long after a wake: restarted cold
    gpu_memory_mb: int | None = None
    sleep_gpu_memory_mb: int | None = None
    sleep_host_memory_mb: int | None = None
    max_adapters: int = 0  # LoRA adapters a replica holds at once (vLLM's --max-loras)
    # Its engines load an adapter themselves on the first request for it (vLLM with
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING and a LoRA resolver plugin): routers may send such a
    # request to a replica with a free adapter slot, and the holding is learnt from the engine.
    adapter_resolver: bool = False
    owner: str | None = None  # the tenant its idle GPU time is charged to; None: unallocated

    def to_dict(self) -> dict:
        return asdict(self)

    def copy(self) -> ModelSpec:
        return replace(
            self,
            command=list(self.command),
            env=dict(self.env),
            env_from={name: dict(source) for name, source in self.env_from.items()},
            engine_endpoints=dict(self.engine_endpoints),
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

    @property
    def sleeps(self) -> bool:
        """Whether the fleet may put it to sleep (its engine takes orders to)."""
        return self.sleep_level is not None and self.engine not in SELF_WAKING

    def awake_mb(self, card_mb: int) -> int:
        """GPU memory one of its engines takes awake on a card of `card_mb`."""
        return awake_mb(card_mb, self.gpu_memory_mb)

    def asleep_mb(self) -> int:
        """GPU memory it keeps asleep: CUDA context and graphs (1 GiB when not said)."""
        return self.sleep_gpu_memory_mb if self.sleep_gpu_memory_mb is not None else 1024

    def host_mb(self, card_mb: int) -> int:
        """Host memory it takes per GPU asleep: its weights at level 1 (at most what it
        takes awake, when not said), none at level 2."""
        if self.sleep_level != 1:
            return 0
        if self.sleep_host_memory_mb is not None:
            return self.sleep_host_memory_mb
        return self.awake_mb(card_mb)


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
    sleep: int = 0  # the level its engine is told to sleep at (0: awake)
    slept_at: float = 0.0  # wall clock: when its engine was told to sleep
    idle_at_sleep: float = 0.0  # seconds idle when it was put to sleep (a known lower bound)
    woken_at: float = 0.0  # wall clock: when its engine was last told to wake
    # Ready, its engine asleep by itself (llama.cpp): routed all the same, the next request
    # wakes it; shown as Asleep.
    engine_asleep: bool = False
    # LoRA adapters (controlplane/rules/adapters.py): what it should hold and serve; what it holds
    # until every router has dropped its route; what its engine reports loaded; and why a
    # load failed (not tried on it again).
    want_adapters: list[str] = field(default_factory=list)
    unloading: dict[str, int] = field(default_factory=dict)  # -> first route version without
    withdrawn_version: int = 0  # Retiring or going to sleep: the first route version without it
    adapters: list[str] = field(default_factory=list)
    adapter_failures: dict[str, str] = field(default_factory=dict)
    # Failed with its node (NotReady), its engine maybe still running there; or back with it
    lost: bool = False
    # What its engine holds of its fullest card (MiB, NVML per process; 0: not known), and
    # why that is too much for the neighbours it shares cards with ("" when it is not).
    gpu_memory_used_mb: int = 0
    memory_over: str = ""
    # What its engine was started with and holds (controlplane/rules/held.py): the share of
    # each card in its command, fixed at placement; its asleep reserve (MiB a card); whether
    # its agent said it sleeps (it holds only the reserve until told to wake); and the nodes
    # whose agents said its process is gone there.
    memory_share: float = 0.0
    reserve_mb: int = 0
    asleep_held: bool = False
    gone_from: list[str] = field(default_factory=list)
    # Rebalancing (controlplane/rules/rebalance.py): why it is moving off a hot card (its
    # replacement starts elsewhere, then it takes the safe stop); whether a move placed it
    # (not moved again until it has slept and woken).
    moving: str = ""
    moved_in: bool = False

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
            "sleep": self.sleep,
            "slept_at": self.slept_at,
            "idle_at_sleep": self.idle_at_sleep,
            "woken_at": self.woken_at,
            "engine_asleep": self.engine_asleep,
            "want_adapters": list(self.want_adapters),
            "unloading": dict(self.unloading),
            "withdrawn_version": self.withdrawn_version,
            "adapters": list(self.adapters),
            "adapter_failures": dict(self.adapter_failures),
            "lost": self.lost,
            "gpu_memory_used_mb": self.gpu_memory_used_mb,
            "memory_over": self.memory_over,
            "memory_share": self.memory_share,
            "reserve_mb": self.reserve_mb,
            "asleep_held": self.asleep_held,
            "gone_from": list(self.gone_from),
            "moving": self.moving,
            "moved_in": self.moved_in,
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
            self.sleep,
            self.slept_at,
            self.idle_at_sleep,
            self.woken_at,
            self.engine_asleep,
            list(self.want_adapters),
            dict(self.unloading),
            self.withdrawn_version,
            list(self.adapters),
            dict(self.adapter_failures),
            self.lost,
            self.gpu_memory_used_mb,
            self.memory_over,
            self.memory_share,
            self.reserve_mb,
            self.asleep_held,
            list(self.gone_from),
            self.moving,
            self.moved_in,
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

"""What a tick's steps may ask for: a closed set of actions, each a plain record.

A step (controlplane/tick/steps/) reads one view of the fleet and returns a list of these; the
executor (controlplane/tick/executor.py) is the only code that carries them out. Nothing here acts.

| action         | what the executor does                                                     |
|----------------|----------------------------------------------------------------------------|
| NodeLost       | the node turns NotReady                                                    |
| Fail           | the replica turns Failed (`lost`: with its node, and may come back with it) |
| Forget         | the replica's record goes (stopped, or failed long ago)                    |
| Place          | a new replica on the given GPUs (`swap_since`: a swap that began then)     |
| Withdraw       | the safe stop begins: the route goes, the replica turns Retiring           |
| Stop           | the replica stops: at once if it never had a route, else through Withdraw  |
| Drained        | a Retiring replica no router holds any more turns Stopping                 |
| Sleep          | the safe stop, ending in sleep: the route goes, the replica turns Sleeping |
| SleepEngine    | a withdrawn sleeper no router holds: its engine is told to sleep           |
| Wake           | a sleeper's engine is told to wake                                         |
| Revive         | a replica on its way out (its engine awake) serves again                   |
| Hold           | a replica on its way out: its reason names what still holds it             |
| Reserve        | GPUs kept for a waiting model while its victims go                         |
| Release        | a model's kept GPUs are kept no longer                                     |
| SetScaled      | how many replicas of a model to keep now (None: as its spec says)          |
| SetReason      | why a model is not fully placed ("" once it is)                            |
| SetRoom        | what a model waits for to get room (None: nothing)                         |
| SetDemandSince | since when requests have waited for a model (None: nobody waits)           |
| SetWoken       | a model was woken now: not stopped for idleness before its time           |
| SetAutoscale   | the last autoscaling decision and its window, for views and the next one   |
| LoadAdapter    | a replica is to hold an adapter                                            |
| UnloadAdapter  | an adapter's route on a replica goes; unloaded once no router holds it     |
| Unloaded       | adapters no router holds on a replica any more are dropped from it        |
| SetAdapterReason | why an adapter is not loaded ("" once it is)                             |
| Counted        | a stop or sleep decided for `kind` (idle, room, sleep), for /metrics       |
| Event          | a line in a model's history                                                |
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeLost:
    node: str
    silent_s: float


@dataclass(frozen=True)
class Fail:
    replica: str
    why: str
    lost: bool = False


@dataclass(frozen=True)
class Forget:
    replica: str


@dataclass(frozen=True)
class Place:
    model: str
    placement: tuple  # Slices
    swap_since: float | None = None
    why: str = ""
    moved: bool = False  # the replacement of a replica moving off a hot card


@dataclass(frozen=True)
class SetMoving:
    replica: str
    why: str  # "": the move is called off


@dataclass(frozen=True)
class Withdraw:
    replica: str
    why: str


@dataclass(frozen=True)
class Stop:
    replica: str
    why: str


@dataclass(frozen=True)
class Drained:
    replica: str
    why: str


@dataclass(frozen=True)
class Sleep:
    replica: str
    why: str
    idle_s: float


@dataclass(frozen=True)
class SleepEngine:
    replica: str
    level: int
    why: str


@dataclass(frozen=True)
class Wake:
    replica: str
    why: str
    swap_since: float | None = None


@dataclass(frozen=True)
class Revive:
    replica: str
    why: str


@dataclass(frozen=True)
class Hold:
    replica: str
    why: str


@dataclass(frozen=True)
class Reserve:
    reservation: object  # records.Reservation
    room: dict


@dataclass(frozen=True)
class Release:
    model: str
    why: str = ""  # "" when it is released because it was used


@dataclass(frozen=True)
class SetScaled:
    model: str
    replicas: int | None


@dataclass(frozen=True)
class SetReason:
    model: str
    reason: str
    quiet: bool = False


@dataclass(frozen=True)
class SetRoom:
    model: str
    room: dict | None


@dataclass(frozen=True)
class SetDemandSince:
    model: str
    since: float | None


@dataclass(frozen=True)
class SetWoken:
    model: str


@dataclass(frozen=True)
class SetAutoscale:
    model: str
    info: dict | None
    window: object = None  # autoscale.Window


@dataclass(frozen=True)
class LoadAdapter:
    replica: str
    adapter: str


@dataclass(frozen=True)
class UnloadAdapter:
    replica: str
    adapter: str
    why: str


@dataclass(frozen=True)
class Unloaded:
    replica: str
    adapters: tuple[str, ...]


@dataclass(frozen=True)
class SetAdapterReason:
    adapter: str
    reason: str


@dataclass(frozen=True)
class Counted:
    kind: str


@dataclass(frozen=True)
class Event:
    model: str
    message: str


Action = (
    NodeLost | Fail | Forget | Place | Withdraw | Stop | Drained | Sleep | SleepEngine | Wake
    | Revive | Hold | Reserve | Release | SetScaled | SetReason | SetRoom | SetDemandSince
    | SetWoken | SetAutoscale | LoadAdapter | UnloadAdapter | Unloaded | SetAdapterReason
    | Counted | Event
)  # fmt: skip

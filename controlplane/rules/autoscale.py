"""Autoscaling on load, as a pure step over one snapshot and a clock (Knative's `Scale()`):
given a model's load and its window of past recommendations, how many replicas to keep.

| the load says                                  | what happens                                 |
|------------------------------------------------|----------------------------------------------|
| more replicas than now                         | out at once, at most doubling a tick; from no |
|                                                | Ready replica straight to what is asked      |
| fewer, but not for all of `scale_down_delay`   | nothing: the highest recommendation over the |
|                                                | window wins (Kubernetes' HPA stabilization)  |
| fewer for the whole window                     | in by one replica a tick (the smaller count  |
|                                                | is never over target: it is at least the     |
|                                                | recommendation, ceil(load / target))         |
| a silent router holds the model                | never in: its load is not known              |

load = requests in flight on the model's replicas plus its waiting requests, summed over live
routers; recommended = ceil(load / target_in_flight), within [min_replicas, max_replicas], and
at least 1 while requests wait. With `target_waiting`, the engines' own queues count too: when
the requests queued inside its engines (as routers last read them, the freshest reading of
each replica) exceed target_waiting per Ready replica, recommended is at least
ceil(queued / target_waiting), the HPA's rule on an average (ceil(ready * mean / target)). It
only scales out: an empty queue says nothing of how many replicas the load needs.

The window is a list of (time, recommendation) change points,
kept for `scale_down_delay` (plus the point in force at its start) and persisted, so that a
control-plane restart neither scales in early nor forgets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from controlplane.vocabulary.model import ModelSpec
from controlplane.vocabulary.specs import format_duration


@dataclass
class Window:
    """Change points of the recommendation: (wall time, replicas), oldest first."""

    points: list[tuple[float, int]] = field(default_factory=list)
    since: float = 0.0  # when the window began to be kept: no scale-in before since + delay

    def to_dict(self) -> dict:
        return {"points": [list(p) for p in self.points], "since": self.since}

    @classmethod
    def from_dict(cls, body: dict) -> Window:
        return cls([(float(at), int(n)) for at, n in body.get("points", [])], body["since"])


@dataclass(frozen=True)
class Decision:
    replicas: int  # what to keep now
    recommended: int  # what the load alone asks for
    reason: str  # for `gpuctl models`: "14 in flight, target 4 -> 4"
    window: Window


def recommend(spec: ModelSpec, load: int, waiting: int, queued: int = 0, ready: int = 0) -> int:
    wanted = math.ceil(load / spec.target_in_flight) if load else 0
    if waiting:
        wanted = max(wanted, 1)
    if spec.target_waiting is not None and queued > spec.target_waiting * ready:
        wanted = max(wanted, math.ceil(queued / spec.target_waiting))
    return min(max(wanted, spec.floor), spec.ceiling)


def decide(
    spec: ModelSpec,
    current: int,
    ready: int,
    in_flight: int,
    waiting: int,
    window: Window | None,
    now: float,
    silent_router: str = "",
    queued: int = 0,
) -> Decision:
    """`current`: the replicas kept now; `ready`: how many of them are Ready; `in_flight` and
    `waiting`: the model's load from live routers; `silent_router`: one that holds the model
    ("" when none does); `queued`: requests waiting inside its engines, as routers read them."""
    load = in_flight + waiting
    wanted = recommend(spec, load, waiting, queued, ready)
    window = _record(window, now, wanted, spec.scale_down_delay_s)
    said = f"{in_flight} in flight" + (f", {waiting} waiting" if waiting else "")
    said += f", target {_number(spec.target_in_flight)}"
    if spec.target_waiting is not None:
        said += f"; {queued} queued in engines, target {_number(spec.target_waiting)} a replica"
    if wanted > current:
        step = wanted if ready == 0 else min(wanted, max(1, current * 2))
        return Decision(step, wanted, f"{said} -> {wanted}" + _partway(step, wanted), window)
    if wanted == current:
        return Decision(current, wanted, f"{said} -> {wanted}", window)
    if silent_router:
        why = f"{said} -> {wanted}; not in while silent router {silent_router} holds it"
        return Decision(current, wanted, why, window)
    highest = max(n for _, n in _within(window, now, spec.scale_down_delay_s))
    if now - window.since < spec.scale_down_delay_s or highest >= current:
        delay = format_duration(spec.scale_down_delay_s)
        return Decision(current, wanted, f"{said} -> {wanted}; in after {delay} lower", window)
    smaller = current - 1
    return Decision(smaller, wanted, f"{said} -> {wanted}" + _partway(smaller, wanted), window)


def _record(window: Window | None, now: float, wanted: int, delay_s: float) -> Window:
    points = list(window.points) if window is not None else []
    since = window.since if window is not None else now
    if not points or points[-1][1] != wanted:
        points.append((now, wanted))
    # Keep what the window covers, and the point in force at its start.
    start = now - delay_s
    while len(points) > 1 and points[1][0] <= start:
        points.pop(0)
    return Window(points, since)


def _within(window: Window, now: float, delay_s: float) -> list[tuple[float, int]]:
    start = now - delay_s
    inside = [p for p in window.points if p[0] > start]
    before = [p for p in window.points if p[0] <= start]
    return ([before[-1]] if before else []) + inside


def _partway(step: int, wanted: int) -> str:
    return "" if step == wanted else f" (now {step})"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"

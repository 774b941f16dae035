"""Idle tracking: the ActivitySink that routers report to, and `idle_for(replica)`.

Unknown is never zero. A replica is `exact` once some router saw it used (newest use wins,
persisted); `at_least` S seconds when every live router that routes to it has watched it for S
seconds without a use; `unknown` when no live router reports it. Router seconds are measured
on the router's clock and turned into times with this process's receive time, so no two
machines' clocks are ever compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum


class IdleState(StrEnum):
    EXACT = "exact"
    AT_LEAST = "at_least"
    UNKNOWN = "unknown"


UNKNOWN_SECONDS = -1.0


@dataclass
class RouterReport:
    router: str
    received_at: float  # this process's wall clock
    uptime_s: float
    watched: dict[str, float]


class ReportError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def parse_report(body) -> tuple[str, float, dict[str, float], dict[str, float]]:
    """Validate an activity report; ReportError names the bad field."""
    if not isinstance(body, dict):
        raise ReportError("report", "expected a JSON object")
    router = body.get("router")
    if not isinstance(router, str) or not router:
        raise ReportError("router", "required, a non-empty string")
    uptime = body.get("uptime_s")
    if isinstance(uptime, bool) or not isinstance(uptime, int | float) or uptime < 0:
        raise ReportError("uptime_s", "required, a non-negative number")
    return router, float(uptime), _seconds_map(body, "used"), _seconds_map(body, "watched")


def _seconds_map(body: dict, name: str) -> dict[str, float]:
    """A map of replica id to non-negative seconds, checked in C as far as possible: reports
    carry thousands of entries, once a tick, from every router."""
    value = body.get(name)
    problem = ReportError(name, "required, a map of replica id to non-negative seconds")
    if not isinstance(value, dict):
        raise problem
    if value:
        try:
            # min() raises on mixed types; on one type it returns a value to check.
            smallest = min(value.values())
        except TypeError:
            raise problem from None
        if not isinstance(smallest, int | float) or isinstance(smallest, bool) or smallest < 0:
            raise problem
    return value


class IdleTracker:
    def __init__(self, live_window_s: float = 10.0, clock=time.time) -> None:
        self.live_window_s = live_window_s
        self.clock = clock
        self.routers: dict[str, RouterReport] = {}
        self.last_used_at: dict[str, float] = {}
        self.dirty: dict[str, float] = {}  # changed since the last flush to the store

    def load(self, last_used_at: dict[str, float]) -> None:
        self.last_used_at.update(last_used_at)

    def report(self, body) -> None:
        """ActivitySink: take one router's report (raises ReportError when malformed)."""
        router, uptime, used, watched = parse_report(body)
        now = self.clock()
        for replica, seconds in used.items():
            at = now - seconds
            if at > self.last_used_at.get(replica, float("-inf")):
                self.last_used_at[replica] = at
                self.dirty[replica] = at
        self.routers[router] = RouterReport(router, now, uptime, watched)

    def live_routers(self) -> list[RouterReport]:
        now = self.clock()
        return [r for r in self.routers.values() if now - r.received_at <= self.live_window_s]

    def forget_stale_routers(self, older_than_s: float = 3600.0) -> None:
        now = self.clock()
        for name in [n for n, r in self.routers.items() if now - r.received_at > older_than_s]:
            del self.routers[name]

    def forget_replica(self, replica: str) -> None:
        self.last_used_at.pop(replica, None)
        self.dirty.pop(replica, None)

    def take_dirty(self) -> dict[str, float]:
        dirty, self.dirty = self.dirty, {}
        return dirty

    def idle_for(self, replica: str, live: list[RouterReport] | None = None):
        """(seconds, IdleState) of one replica; pass `live` when asking for many at once."""
        now = self.clock()
        live = self.live_routers() if live is None else live
        watching = [r for r in live if replica in r.watched]
        if not watching:
            return UNKNOWN_SECONDS, IdleState.UNKNOWN
        last = self.last_used_at.get(replica)
        if last is not None:
            return max(0.0, now - last), IdleState.EXACT
        bound = min(r.watched[replica] + (now - r.received_at) for r in watching)
        return bound, IdleState.AT_LEAST

    def idle_map(self, replicas) -> dict[str, tuple[float, IdleState]]:
        live = self.live_routers()
        return {replica: self.idle_for(replica, live) for replica in replicas}

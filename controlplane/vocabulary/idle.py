"""Idle tracking: the ActivitySink that routers report to, and `idle_for(replica)`.

Unknown is never zero, and never idle. Routers have a stable identity and an incarnation (one
per process start). To this tracker a router is:

- live: it reported within the lease (`live_window_s`);
- gone: it said goodbye (a final report on a clean shutdown), or a newer incarnation of the
  same identity reported;
- silent: neither. It may be cut off and still serving from its last table, so every replica
  in that table is `unknown` until it reports again, is superseded, or an operator forgets it.
  Nothing turns silent into gone by itself.

A replica is `exact` when the newest use any router reported is the newest use there can have
been; `at_least S` when S is a lower bound: the time since the last moment at which any router
might have used it. A router's watch of a replica runs from when it began routing to it; an
incarnation that said goodbye hands its watch on to its successor (no gap: it routed nothing
in between), one that died leaves a gap from its last report to its successor's start, and a
use may hide there, so nothing is counted across it.

Router seconds are turned into times with this process's clock on receipt: no two machines'
clocks are ever compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from controlplane.vocabulary.rates import RequestRates


class IdleState(StrEnum):
    EXACT = "exact"
    AT_LEAST = "at_least"
    UNKNOWN = "unknown"


class RouterState(StrEnum):
    LIVE = "live"
    SILENT = "silent"
    GONE = "gone"


UNKNOWN_SECONDS = -1.0


@dataclass
class Router:
    """What the tracker knows of one router identity (its newest incarnation)."""

    id: str
    incarnation: str
    received_at: float  # this process's wall clock, at the last report
    uptime_s: float
    started_at: float  # received_at - uptime_s: when the incarnation began
    watch_origin: dict[str, float]  # replica -> since when this identity watched it, no gap
    goodbye: bool = False
    route_version: int = -1
    in_flight: dict[str, int] = field(default_factory=dict)  # replica -> requests on it now
    waiting: dict[str, int] = field(default_factory=dict)  # model -> requests parked for it
    # replica -> [waiting, running, KV use, seconds since read]: the engine's own load as the
    # router last read it, as of received_at
    engine_load: dict[str, list] = field(default_factory=dict)
    # The watch a predecessor that said goodbye handed on, for replicas this incarnation has
    # not reported yet (its first report can come before its routing table).
    inherited: dict[str, float] = field(default_factory=dict)
    # Loaded from the store by a control plane that started (or took over as leader) and has
    # not heard it since: silent until it reports, however recent its last report.
    restored: bool = False

    def may_route_to(self, replica: str) -> bool:
        """Whether, silent, it may be routing to `replica` unseen: it was in its last watch, or
        in the watch it inherited, or its last report came before any table (routes that came
        after may hold anything)."""
        return replica in self.watch_origin or replica in self.inherited or not self.watch_origin

    def state(self, now: float, live_window_s: float) -> RouterState:
        if self.goodbye:
            return RouterState.GONE
        if not self.restored and now - self.received_at <= live_window_s:
            return RouterState.LIVE
        return RouterState.SILENT

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "incarnation": self.incarnation,
            "received_at": self.received_at,
            "uptime_s": self.uptime_s,
            "started_at": self.started_at,
            "watch_origin": self.watch_origin,
            "goodbye": self.goodbye,
            "route_version": self.route_version,
            "in_flight": self.in_flight,
            "inherited": self.inherited,
        }

    @classmethod
    def from_dict(cls, body: dict) -> Router:
        # Requests in flight and waiting are news of the moment: not kept across restarts.
        return cls(**{**body, "in_flight": {}, "waiting": {}, "engine_load": {}, "restored": True})


@dataclass
class Report:
    router: str
    incarnation: str
    uptime_s: float
    used: dict[str, float]
    watched: dict[str, float]
    goodbye: bool = False
    route_version: int = -1
    in_flight: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)  # model -> requests parked
    engine_load: dict[str, list] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)  # replica -> sent since watched


class ReportError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def parse_report(body) -> Report:
    """Validate an activity report; ReportError names the bad field."""
    if not isinstance(body, dict):
        raise ReportError("report", "expected a JSON object")
    router = body.get("router")
    if not isinstance(router, str) or not router:
        raise ReportError("router", "required, a non-empty string")
    incarnation = body.get("incarnation", "")
    if not isinstance(incarnation, str):
        raise ReportError("incarnation", "a string")
    uptime = body.get("uptime_s")
    if isinstance(uptime, bool) or not isinstance(uptime, int | float) or uptime < 0:
        raise ReportError("uptime_s", "required, a non-negative number")
    goodbye = body.get("goodbye", False)
    if not isinstance(goodbye, bool):
        raise ReportError("goodbye", "true or false")
    version = body.get("route_version", -1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ReportError("route_version", "an integer")
    return Report(
        router,
        incarnation,
        float(uptime),
        _seconds_map(body, "used"),
        _seconds_map(body, "watched"),
        goodbye,
        version,
        _count_map(body, "in_flight"),
        _count_map(body, "waiting"),
        _engine_load_map(body),
        _count_map(body, "requests"),
    )


def _engine_load_map(body: dict) -> dict[str, list]:
    """replica -> [waiting, running, KV use within 0..1, seconds since read]."""
    value = body.get("engine_load", {})
    problem = ReportError(
        "engine_load",
        "a map of replica id to [waiting, running, KV use 0..1, seconds since read]",
    )
    if not isinstance(value, dict):
        raise problem
    for reading in value.values():
        if not isinstance(reading, list) or len(reading) != 4:
            raise problem
        waiting, running, kv_use, age = reading
        if not all(_count(n) for n in (waiting, running)) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in (kv_use, age)
        ):
            raise problem
        if not 0 <= kv_use <= 1 or not 0 <= age < float("inf"):
            raise problem
    return value


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count_map(body: dict, name: str) -> dict[str, int]:
    value = body.get(name, {})
    if not isinstance(value, dict) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value.values()
    ):
        raise ReportError(name, "a map of name to a non-negative count")
    return value


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


# An adapter's endpoint is `REPLICA@ADAPTER` (controlplane/rules/adapters.py): its own slot in the
# router, so its use is known per (replica, adapter).
SLOT_SEP = "@"


def fold_adapter_slots(report: Report) -> None:
    """A use of, or a request on, a replica's adapter is a use of, or a request on, the
    replica: what would stop or put the replica to sleep must see it."""
    for key, seconds in list(report.used.items()):
        replica, sep, _ = key.partition(SLOT_SEP)
        if sep:
            report.used[replica] = min(report.used.get(replica, seconds), seconds)
    folded = dict(report.in_flight)
    for key, count in report.in_flight.items():
        replica, sep, _ = key.partition(SLOT_SEP)
        if sep:
            folded[replica] = folded.get(replica, 0) + count
    report.in_flight = folded
    sent: dict[str, int] = {}
    for key, count in report.requests.items():
        replica = key.partition(SLOT_SEP)[0]
        sent[replica] = sent.get(replica, 0) + count
    report.requests = sent


class IdleTracker:
    def __init__(self, live_window_s: float = 10.0, clock=time.time) -> None:
        self.live_window_s = live_window_s
        self.clock = clock
        self.routers: dict[str, Router] = {}
        self.last_used_at: dict[str, float] = {}
        # replica -> the end of the newest gap in which a router that died may have used it
        self.unseen_until: dict[str, float] = {}
        self.dirty: dict[str, float] = {}  # uses changed since the last flush to the store
        self.dirty_routers: set[str] = set()  # routers changed since the last flush
        self.dirty_gaps: dict[str, float] = {}
        self.rates = RequestRates()  # how popular each replica is (vocabulary/rates.py)

    def load(self, last_used_at: dict[str, float], routers=(), gaps=None) -> None:
        self.last_used_at.update(last_used_at)
        for router in routers:
            self.routers[router.id] = router
        self.unseen_until.update(gaps or {})

    def report(self, body) -> Report:
        """ActivitySink: take one router's report (raises ReportError when malformed)."""
        report = parse_report(body)
        fold_adapter_slots(report)
        now = self.clock()
        for replica, seconds in report.used.items():
            at = now - seconds
            if at > self.last_used_at.get(replica, float("-inf")):
                self.last_used_at[replica] = at
                self.dirty[replica] = at
        started = now - report.uptime_s
        known = self.routers.get(report.router)
        if known is None or known.incarnation != report.incarnation:
            self.routers[report.router] = self._successor(known, report, now, started)
            self.dirty_routers.add(report.router)
        else:
            if known.watch_origin.keys() != report.watched.keys():
                # Its table changed: replicas it keeps keep their origin, new ones start now.
                self.dirty_routers.add(report.router)
                origins, inherited = known.watch_origin, known.inherited
                known.watch_origin = {
                    replica: origins[replica]
                    if replica in origins
                    else inherited.get(replica, now - seconds)
                    for replica, seconds in report.watched.items()
                }
            known.received_at = now
            known.restored = False
            known.uptime_s = report.uptime_s
            if report.goodbye and not known.goodbye:
                self.dirty_routers.add(report.router)
                # Sticky: a tick's report that arrives after the goodbye changes nothing.
                known.goodbye = True
        router = self.routers[report.router]
        router.route_version = report.route_version
        router.in_flight = report.in_flight
        router.waiting = report.waiting
        router.engine_load = report.engine_load
        self.rates.take(report.router, report.incarnation, report.requests, now)
        return report

    def _successor(self, before: Router | None, report: Report, now: float, started: float):
        inherited: dict[str, float] = {}
        if before is not None:
            if before.goodbye:
                # A clean handover: nothing was routed between goodbye and this start.
                inherited = {**before.inherited, **before.watch_origin}
            else:
                # It died without a word after its last report: a use may hide before this
                # incarnation's start, in any replica its table held.
                for replica in before.watch_origin:
                    if started > self.unseen_until.get(replica, float("-inf")):
                        self.unseen_until[replica] = started
                        self.dirty_gaps[replica] = started
        origins = {
            replica: inherited.get(replica, now - seconds)
            for replica, seconds in report.watched.items()
        }
        return Router(
            report.router,
            report.incarnation,
            now,
            report.uptime_s,
            started,
            origins,
            report.goodbye,
            inherited=inherited,
        )

    def forget_router(self, router_id: str) -> Router:
        """An operator says the router is really gone. A use it made and never reported may
        have happened up to now: its replicas' bounds start again from now."""
        router = self.routers.pop(router_id)
        now = self.clock()
        if not router.goodbye:
            for replica in router.watch_origin:
                self.unseen_until[replica] = now
                self.dirty_gaps[replica] = now
        self.dirty_routers.add(router_id)
        return router

    def states(self, now: float | None = None) -> dict[str, RouterState]:
        now = self.clock() if now is None else now
        return {rid: r.state(now, self.live_window_s) for rid, r in self.routers.items()}

    def live_routers(self, now: float | None = None) -> list[Router]:
        now = self.clock() if now is None else now
        return [
            r for r in self.routers.values() if r.state(now, self.live_window_s) is RouterState.LIVE
        ]

    def silent_routers(self, now: float | None = None) -> list[Router]:
        now = self.clock() if now is None else now
        return [
            r
            for r in self.routers.values()
            if r.state(now, self.live_window_s) is RouterState.SILENT
        ]

    def forget_gone(self, older_than_s: float = 3600.0) -> None:
        """Routers that said goodbye long ago: kept only so that a successor inherits their
        watch; a successor that comes later simply starts its own (a shorter bound)."""
        now = self.clock()
        for rid in [
            rid
            for rid, r in self.routers.items()
            if r.goodbye and now - r.received_at > older_than_s
        ]:
            del self.routers[rid]
            self.dirty_routers.add(rid)

    def router_rows(self, now: float | None = None) -> list[dict]:
        now = self.clock() if now is None else now
        rows = []
        for router in sorted(self.routers.values(), key=lambda r: r.id):
            state = router.state(now, self.live_window_s)
            rows.append(
                {
                    "id": router.id,
                    "incarnation": router.incarnation,
                    "state": str(state),
                    "last_report_s": round(now - router.received_at, 3),
                    "uptime_s": round(
                        now - router.started_at if state is RouterState.LIVE else router.uptime_s,
                        3,
                    ),
                    "replicas_watched": len(router.watch_origin),
                    "route_version": router.route_version,
                    "in_flight": sum(router.in_flight.values()),
                }
            )
        return rows

    def still_held(self, replica: str, withdrawn_in: int | None = None) -> str:
        """Why `replica` cannot be stopped yet ("" when no router holds it): a router that
        may route to it or has requests on it. Its route must be withdrawn first.
        `withdrawn_in`: the first route version without it; a live router that has not reported
        a table that new may have taken, after its last report, one with the route."""
        now = self.clock()
        for router in self.routers.values():
            state = router.state(now, self.live_window_s)
            if state is RouterState.GONE:
                continue
            if state is RouterState.SILENT and router.may_route_to(replica):
                return f"silent router {router.id} may still route to it"
            if replica in router.watch_origin:
                return f"router {router.id} has not dropped its route yet"
            if router.in_flight.get(replica):
                return f"router {router.id} has {router.in_flight[replica]} request(s) on it"
            if (
                withdrawn_in is not None
                and state is RouterState.LIVE
                and router.route_version < withdrawn_in
            ):
                return f"router {router.id} has not acknowledged route version {withdrawn_in} yet"
        return ""

    def waiting(self, now: float | None = None) -> dict[str, int]:
        """model -> requests live routers hold for it, waiting for a replica."""
        total: dict[str, int] = {}
        for router in self.live_routers(now):
            for model, count in router.waiting.items():
                total[model] = total.get(model, 0) + count
        return total

    def engine_load(self, now: float | None = None) -> dict[str, dict]:
        """replica -> the freshest reading of its engine's own load among live routers:
        {"waiting", "running", "kv_use", "age_s" (now), "router"}."""
        now = self.clock() if now is None else now
        freshest: dict[str, dict] = {}
        for router in self.live_routers(now):
            since = max(0.0, now - router.received_at)
            for replica, (waiting, running, kv_use, age) in router.engine_load.items():
                age_now = age + since
                if replica not in freshest or age_now < freshest[replica]["age_s"]:
                    freshest[replica] = {
                        "waiting": waiting,
                        "running": running,
                        "kv_use": kv_use,
                        "age_s": round(age_now, 3),
                        "router": router.id,
                    }
        return freshest

    def in_flight(self, now: float | None = None, live_only: bool = False) -> dict[str, int]:
        """replica -> requests on it, summed over every router not gone (a silent one's last
        word included: it may still be serving them), or over live routers only."""
        now = self.clock() if now is None else now
        total: dict[str, int] = {}
        for router in self.routers.values():
            state = router.state(now, self.live_window_s)
            if state is RouterState.GONE or (live_only and state is not RouterState.LIVE):
                continue
            for replica, count in router.in_flight.items():
                total[replica] = total.get(replica, 0) + count
        return total

    def silent_holders(self, replicas, now: float | None = None) -> dict[str, str]:
        """replica -> a silent router that has it in its table."""
        silent = self.silent_routers(now)
        return {
            r: next(s.id for s in silent if s.may_route_to(r))
            for r in replicas
            if any(s.may_route_to(r) for s in silent)
        }

    def forget_replica(self, replica: str) -> None:
        self.last_used_at.pop(replica, None)
        self.dirty.pop(replica, None)
        self.unseen_until.pop(replica, None)

    def take_dirty(self) -> dict[str, float]:
        dirty, self.dirty = self.dirty, {}
        return dirty

    def take_dirty_routers(self) -> tuple[list[Router], list[str], dict[str, float]]:
        """(routers to store, router ids to delete, gaps to store) since the last call."""
        changed, self.dirty_routers = self.dirty_routers, set()
        gaps, self.dirty_gaps = self.dirty_gaps, {}
        kept = [self.routers[rid] for rid in changed if rid in self.routers]
        removed = [rid for rid in changed if rid not in self.routers]
        return kept, removed, gaps

    def idle_for(self, replica: str, live=None, silent=None):
        """(seconds, IdleState) of one replica; pass `live` and `silent` when asking for many."""
        live = self.live_routers() if live is None else live
        silent = self.silent_routers() if silent is None else silent
        if any(r.may_route_to(replica) for r in silent):
            return UNKNOWN_SECONDS, IdleState.UNKNOWN
        watching = [r for r in live if replica in r.watch_origin]
        if not watching:
            return UNKNOWN_SECONDS, IdleState.UNKNOWN
        # Known only as of the stalest report of any live router: one cut off a moment ago
        # may be using it now, and one whose routes arrived after its report may too; neither
        # must make it look idle meanwhile.
        as_of = min(r.received_at for r in live)
        last = self.last_used_at.get(replica)
        unseen = self.unseen_until.get(replica)
        if last is not None and (unseen is None or last >= unseen):
            return max(0.0, as_of - last), IdleState.EXACT
        # The shortest unbroken watch among live routers, never across a dead router's gap.
        bound = as_of - max(r.watch_origin[replica] for r in watching)
        if unseen is not None:
            bound = min(bound, as_of - unseen)
        return max(0.0, bound), IdleState.AT_LEAST

    def idle_map(self, replicas, now: float | None = None) -> dict[str, tuple[float, IdleState]]:
        live, silent = self.live_routers(now), self.silent_routers(now)
        return {replica: self.idle_for(replica, live, silent) for replica in replicas}

    def unknown_because_silent(self, replicas, now: float | None = None) -> set[str]:
        silent = self.silent_routers(now)
        return {r for r in replicas if any(s.may_route_to(r) for s in silent)}

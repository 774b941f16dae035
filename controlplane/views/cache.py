"""What operators read (the summary, the tables, /metrics), built once per change and off the
event loop.

At 16,000 nodes a summary walks the whole fleet for most of a second; built on the loop, once per
request, a few `gpuctl status` calls kept heartbeats waiting past the node timeout. Here the
loop only copies the state (one snapshot, one moment); each view of that copy is built in a
worker thread and kept, so that every reader of the same state, concurrent or within
`max_age_s`, shares one computation. A change of state (a spec, a node, a replica, a router's
report, a reconcile tick) starts a new snapshot at the next read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controlplane.state.fleet import Fleet, FleetSnapshot

MAX_AGE_S = 1.0  # how long an unchanged fleet's views are served as they are


@dataclass
class Moment:
    key: tuple
    at: float  # the fleet's wall clock when the snapshot was taken
    snap: FleetSnapshot
    views: dict[Any, asyncio.Future] = field(default_factory=dict)


class Views:
    def __init__(
        self,
        fleet: Fleet,
        route_version: Callable[[], int],
        counters: Callable[[], tuple] = tuple,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        """`counters`: what, besides the fleet's own changes and the route table, moves when
        the state does (the reconcile ticks run, the router reports taken)."""
        self.fleet = fleet
        self.route_version = route_version
        self.counters = counters
        self.max_age_s = max_age_s
        self.moment: Moment | None = None
        self.built = 0  # views computed, for the tests and /metrics

    def current(self) -> Moment:
        route_version = self.route_version()
        key = (self.fleet.version, route_version, *self.counters())
        now = self.fleet.wall()
        moment = self.moment
        if moment is None or moment.key != key or not 0 <= now - moment.at < self.max_age_s:
            moment = self.moment = Moment(key, now, self.fleet.snapshot(route_version))
        return moment

    async def get(self, name: Any, build: Callable[[FleetSnapshot], Any]) -> Any:
        """The view `name` of the current state: `build(snapshot)`, run in a thread unless a
        reader of the same state has already asked for it. `build` must only read its snapshot
        (it is the reader's own copy, so the loop may change the fleet meanwhile)."""
        moment = self.current()
        future = moment.views.get(name)
        if future is None:
            self.built += 1
            future = asyncio.ensure_future(asyncio.to_thread(build, moment.snap))
            moment.views[name] = future
            future.add_done_callback(lambda done: self._forget_failed(moment, name, done))
        # A reader that goes away must not cancel the view for the others waiting on it.
        return await asyncio.shield(future)

    @staticmethod
    def _forget_failed(moment: Moment, name: Any, done: asyncio.Future) -> None:
        """A view that raised is built again by the next reader, not served as an error."""
        if not done.cancelled() and done.exception() is None:
            return
        if moment.views.get(name) is done:
            del moment.views[name]

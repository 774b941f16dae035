"""What a server acts with while it leads (a term), and who leads.

A term is one leader's working state: the fleet loaded from the store, its reconciler and the
views of it. With SQLite there is one server and one term for its whole life (`Sole`). On
PostgreSQL a term begins when this server wins the lease and ends when it loses it or its
store fails (`Elected`); in between it is a standby and has no term at all, so nothing can act
on a state it no longer owns.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from controlplane.state.fleet import Fleet
from controlplane.tick.reconciler import Reconciler
from controlplane.views.cache import Views


@dataclass
class Term:
    fleet: Fleet
    reconciler: Reconciler
    epoch: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stats: dict = field(default_factory=lambda: {"activity_reports": 0, "ticks": 0})
    views: Views = field(init=False)
    # What waits for the next tick to be over (a router's demand waits for its placement).
    tick_waiters: list = field(default_factory=list)
    soon: asyncio.TimerHandle | None = None  # a wake coalescing routers' prompt reports

    def wake_soon(self, within_s: float) -> None:
        """Wake the tick loop within `within_s`, once for every call made meanwhile: sixteen
        routers that each report at once as they begin to ask for a tenant make one new
        table, not sixteen."""
        if self.soon is None:
            self.soon = asyncio.get_running_loop().call_later(within_s, self._woken)

    def _woken(self) -> None:
        self.soon = None
        self.wake.set()

    async def after_next_tick(self, timeout: float) -> bool:
        """Wake the tick loop and wait until the tick after now is over (False: not within
        `timeout`)."""
        done = asyncio.get_running_loop().create_future()
        self.tick_waiters.append(done)
        self.wake.set()
        try:
            async with asyncio.timeout(timeout):  # on a timeout the loop skips it
                await done
            return True
        except TimeoutError:
            return False

    def __post_init__(self) -> None:
        stats, routes = self.stats, self.reconciler.routes
        # The closures hold what they read, not the term: a term no longer used is freed then.
        self.views = Views(
            self.fleet,
            lambda: routes.version,
            lambda: (stats["ticks"], stats["activity_reports"]),
        )


class Sole:
    """One server on its own state: it always leads."""

    def __init__(self, term: Term, url: str = "") -> None:
        self.term: Term | None = term
        self.url = url

    @property
    def leader_url(self) -> str | None:
        return self.url

    def describe(self) -> dict:
        return {"leader": True, "url": self.url, "epoch": 0, "store": "sqlite"}


class Elected:
    """One of several servers on one PostgreSQL database; `term` is set while it leads."""

    def __init__(self, lease) -> None:
        self.lease = lease
        self._term: Term | None = None

    def bind(self, term: Term | None) -> None:
        self._term = term

    @property
    def term(self) -> Term | None:
        """None from the lease's deadline on, even before the term is ended: a leader that
        was paused past its lease must not answer one more call as the leader."""
        return self._term if self.lease.held else None

    @property
    def leader_url(self) -> str | None:
        """Where a standby sends callers; never itself (a leader past its deadline, not yet
        stepped down, still has its own URL as the last it read)."""
        url = self.lease.leader_url
        return None if url == self.lease.url else url

    def describe(self) -> dict:
        leading = self.term is not None
        return {
            "leader": leading,
            "url": self.lease.url if leading else self.leader_url,
            "epoch": self.term.epoch if leading else None,
            "holder": self.lease.holder,
            "store": "postgresql",
        }

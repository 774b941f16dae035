"""`gpuctl server`'s lifecycle, top to bottom: load state, serve, tick, stop on a signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
import signal
import socket
import time
from dataclasses import dataclass

from aiohttp import web

from controlplane.api.app import build_app
from controlplane.state.fleet import Fleet
from controlplane.state.lease import DB_ERRORS, Lease
from controlplane.state.pgstore import PostgresStore, connect_pool, migrate
from controlplane.state.store import SqliteStore, without_password
from controlplane.tick.leadership import Elected, Sole, Term
from controlplane.tick.reconciler import Reconciler
from controlplane.vocabulary.idle import IdleTracker
from controlplane.vocabulary.looplag import watch_loop_lag
from controlplane.vocabulary.sdnotify import feed_watchdog, notify

log = logging.getLogger("gpufleet.server")
# A fleet's state is millions of long-lived objects, and each view's snapshot allocates hundreds
# of thousands more: at CPython's default thresholds the collector walked the whole heap
# several times a snapshot, which doubled a 16,000-node summary. Collected less often, the
# same cycles are still found.
GC_THRESHOLDS = (50_000, 20, 100)
SLOW_TICK_S = 1.0
PACED_TICK_S = 0.05  # a shorter tick (a small fleet's) runs again as soon as it is woken


@dataclass
class Settings:
    host: str
    port: int
    state: str  # a SQLite file, or a postgresql:// URL
    tokens: dict[str, str]
    tick_s: float = 1.0
    node_timeout_s: float = 15.0
    heartbeat_s: float = 2.0
    max_heartbeats_per_s: float = 500.0
    router_live_s: float = 10.0
    min_residency_s: float = 120.0
    room_timeout_s: float = 600.0
    rebalance: bool = False  # hot cards hand on a hot model (controlplane/rules/rebalance.py)
    metrics_token: str | None = None
    tls: object = None
    advertise: str | None = None  # the URL standbys send callers to; default: the listener's
    lease_ttl_s: float = 5.0
    lease_renew_s: float = 1.0
    auth: str | None = None  # "tenants" or "none"; None: "tenants" once a tenant was applied
    otlp_endpoint: str | None = None  # traces of tick steps and API changes; None: off
    tracing: object = None  # made from otlp_endpoint by serve()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return self.advertise or f"{scheme}://{self.host}:{self.port}"


def on_postgresql(state: str) -> bool:
    return state.startswith(("postgresql://", "postgres://"))


def begin_term(store, settings: Settings, epoch: int = 0, clock_offset_s: float = 0.0) -> Term:
    """A leader's working state, loaded whole from `store`. `clock_offset_s`: the database's
    clock less this host's; the term's wall clock (every time it keeps) is the database's."""

    def wall() -> float:
        return time.time() + clock_offset_s

    idle = IdleTracker(live_window_s=settings.router_live_s, clock=wall)
    fleet = Fleet(store, idle, wall=wall)
    fleet.auth_flag = settings.auth
    reconciler = Reconciler(
        fleet,
        node_timeout_s=settings.node_timeout_s,
        heartbeat_s=settings.heartbeat_s,
        max_heartbeats_per_s=settings.max_heartbeats_per_s,
        min_residency_s=settings.min_residency_s,
        room_timeout_s=settings.room_timeout_s,
        autoscale_every_s=settings.tick_s,
        rebalance=settings.rebalance,
    )
    reconciler.tracing = settings.tracing
    try:
        reconciler.tick()
    except Exception:  # the tick loop tries again, and ends the term if it fails again
        log.exception("the first reconcile tick of a term failed")
    return Term(fleet, reconciler, epoch)


def end_term(term: Term) -> None:
    term.reconciler.routes.release_watchers()
    term.fleet.flush_activity()  # what routers reported since the last tick is kept too


async def serve(settings: Settings) -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    stop = asyncio.Event()
    if settings.otlp_endpoint:
        from controlplane.tick.tracing import ControlPlaneTracing

        settings.tracing = ControlPlaneTracing(settings.otlp_endpoint)
    try:
        if on_postgresql(settings.state):
            await serve_elected(settings, stop)
        else:
            await serve_sole(settings, stop)
    finally:
        if settings.tracing is not None:
            await asyncio.to_thread(settings.tracing.close)


async def listen(settings: Settings, leadership, stop: asyncio.Event) -> web.AppRunner:
    app = build_app(leadership, settings.tokens, settings.metrics_token, settings.tracing)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=3
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port, ssl_context=settings.tls).start()
    except OSError:
        await runner.cleanup()
        raise
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return runner


async def serve_sole(settings: Settings, stop: asyncio.Event) -> None:
    store = SqliteStore(settings.state)
    term = begin_term(store, settings)
    sole = Sole(term, settings.url)
    try:
        runner = await listen(settings, sole, stop)
    except OSError:
        store.close()
        raise
    log.info("gpuctl server listening on %s, state in %s", settings.url, settings.state)
    notify("READY=1", f"STATUS=serving on {settings.url}")
    lag = asyncio.create_task(watch_loop_lag(log))
    watchdog = asyncio.create_task(feed_watchdog())
    stopping = asyncio.create_task(stop.wait())
    ticker = asyncio.create_task(tick_loop(term, settings.tick_s))
    try:
        while True:
            await asyncio.wait({ticker, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.done():
                break
            # A tick failed: its writes were rolled back, so its changes in memory are not
            # stored. Memory is loaded again from the store rather than served apart from it.
            log.error("reloading the state from %s after a failed tick", settings.state)
            end_term(term)
            term = begin_term(store, settings)
            sole.term = term
            ticker = asyncio.create_task(tick_loop(term, settings.tick_s))
    finally:
        notify("STOPPING=1")
        ticker.cancel()
        lag.cancel()
        watchdog.cancel()
        stopping.cancel()
        await asyncio.gather(ticker, lag, watchdog, return_exceptions=True)
        end_term(term)  # before the cleanup, which would wait out each route watcher's poll
        await runner.cleanup()
        term.fleet.flush_activity()  # and the reports that came in as it drained
        store.close()


async def serve_elected(settings: Settings, stop: asyncio.Event) -> None:
    """One of several servers on one database: campaign, lead until the lease or the store is
    lost, stand by, campaign again; on a signal, hand the lease over at once."""
    try:
        pool = await connect_pool(settings.state, hold_s=settings.lease_ttl_s / 2)
    except (ValueError, *DB_ERRORS) as exc:
        where = without_password(settings.state)
        raise OSError(f"cannot reach PostgreSQL at {where}: {exc}") from None
    try:
        await migrate(pool)
        holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        lease = Lease(pool, holder, settings.url, settings.lease_ttl_s, settings.lease_renew_s)
        leadership = Elected(lease)
        runner = await listen(settings, leadership, stop)
    except BaseException:
        await pool.close()
        raise
    log.info("gpuctl server listening on %s, state in PostgreSQL, standing by", settings.url)
    notify("READY=1", f"STATUS=serving on {settings.url}, standing by")
    lag = asyncio.create_task(watch_loop_lag(log))
    watchdog = asyncio.create_task(feed_watchdog())
    stopping = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            campaign = asyncio.create_task(lease.campaign())
            await asyncio.wait({campaign, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not campaign.done():
                campaign.cancel()
                break
            await lead(settings, pool, lease, leadership, campaign.result(), stopping)
    finally:
        notify("STOPPING=1")
        lag.cancel()
        watchdog.cancel()
        stopping.cancel()
        await runner.cleanup()
        await pool.close()


async def lead(settings, pool, lease: Lease, leadership: Elected, epoch: int, stopping) -> None:
    """One term: load the state, act until the lease, the store or the process ends it."""
    started = time.perf_counter()
    store = PostgresStore(pool, epoch, lambda: lease.held)
    holding = asyncio.create_task(lease.hold())
    try:
        await store.start()
        term = begin_term(store, settings, epoch, lease.clock_offset_s)
    except Exception as exc:  # the database went away while the state loaded
        log.error("could not load the state to lead: %s", exc)
        holding.cancel()
        lease.step_down()
        store.close()
        return
    leadership.bind(term)
    log.info("leading (epoch %d), state loaded in %.2f s", epoch, time.perf_counter() - started)
    ticker = asyncio.create_task(tick_loop(term, settings.tick_s, lambda: lease.held))
    await asyncio.wait(
        {holding, store.writer, stopping, ticker}, return_when=asyncio.FIRST_COMPLETED
    )
    leadership.bind(None)
    ticker.cancel()
    await asyncio.gather(ticker, return_exceptions=True)
    end_term(term)
    # A failed tick ends the term as a clean stop does: what was accepted before it is
    # committed, the tick's own changes were never queued; the next term loads the state anew.
    failed_tick = ticker.done() and not ticker.cancelled() and ticker.result() is TICK_FAILED
    if stopping.done() or failed_tick:  # commit what was accepted, then hand the lease over
        await store.drain()
        holding.cancel()
        await asyncio.gather(holding, return_exceptions=True)
        await lease.release(epoch)
    else:
        holding.cancel()
        lease.step_down()
        store.close()


TICK_FAILED = "tick failed"


async def tick_loop(term: Term, tick_s: float, may_act=lambda: True) -> str | None:
    """`may_act`: False once this server may no longer lead (its lease's deadline passed).
    Returns TICK_FAILED after a tick that raised: the term's memory may hold changes that were
    rolled back, so the term must end."""
    reconciler, wake, stats = term.reconciler, term.wake, term.stats
    took = 0.0
    while True:
        # A tick runs on the loop: after a long one that took T, the loop is left to heartbeats
        # and reads for T before changes may wake the next, so that a burst of changes (a
        # thousand models applied at once on a large fleet) never holds the loop for more than
        # half.
        if took > PACED_TICK_S:
            await asyncio.sleep(min(took, tick_s))
        try:
            # Not wait_for, which on Python 3.11 may swallow the stop's cancel (agent.py).
            async with asyncio.timeout(max(0.0, tick_s - took)):
                await wake.wait()
        except TimeoutError:
            pass
        wake.clear()
        if not may_act():
            return
        # Only who waited before this tick began is answered after it.
        waiting, term.tick_waiters = term.tick_waiters, []
        started = time.perf_counter()
        try:
            reconciler.tick()
        except Exception:  # one bad tick must not stop the control plane, nor its memory
            log.exception("reconcile tick failed")  # drift from what is stored: the term ends
            for done in waiting:
                if not done.done():
                    done.set_result(None)
            return TICK_FAILED
        stats["ticks"] += 1
        reconciler.fleet.idle.forget_gone()
        for done in waiting:
            if not done.done():
                done.set_result(None)
        took = time.perf_counter() - started
        if took > SLOW_TICK_S:
            log.warning("reconcile tick took %.1f s", took)

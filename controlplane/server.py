"""`gpuctl server`'s lifecycle, top to bottom: load state, serve, tick, stop on a signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time

from aiohttp import web

from controlplane.api import STATS_KEY, build_app
from controlplane.fleet import Fleet
from controlplane.idle import IdleTracker
from controlplane.looplag import watch_loop_lag
from controlplane.reconciler import Reconciler
from controlplane.store import SqliteStore

log = logging.getLogger("gpufleet.server")
# A fleet's state is millions of long-lived objects, and each view's snapshot allocates hundreds
# of thousands more: at CPython's default thresholds the collector walked the whole heap
# several times a snapshot, which doubled a 16,000-node summary. Collected less often, the
# same cycles are still found.
GC_THRESHOLDS = (50_000, 20, 100)
SLOW_TICK_S = 1.0
PACED_TICK_S = 0.05  # a shorter tick (a small fleet's) runs again as soon as it is woken


async def serve(
    host: str,
    port: int,
    state_path: str,
    tokens: dict[str, str],
    tick_s: float = 1.0,
    node_timeout_s: float = 15.0,
    router_live_s: float = 10.0,
    min_residency_s: float = 120.0,
    metrics_token: str | None = None,
    tls=None,
) -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    store = SqliteStore(state_path)
    fleet = Fleet(store, IdleTracker(live_window_s=router_live_s, clock=time.time))
    reconciler = Reconciler(
        fleet,
        node_timeout_s=node_timeout_s,
        min_residency_s=min_residency_s,
        autoscale_every_s=tick_s,
    )
    reconciler.tick()
    wake = asyncio.Event()
    app = build_app(fleet, reconciler, tokens, wake, metrics_token)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=3
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=tls).start()
    except OSError:
        await runner.cleanup()
        store.close()
        raise
    scheme = "https" if tls is not None else "http"
    log.info("gpuctl server listening on %s://%s:%d, state in %s", scheme, host, port, state_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    ticker = asyncio.create_task(tick_loop(reconciler, wake, tick_s, app[STATS_KEY]))
    lag = asyncio.create_task(watch_loop_lag(log))
    try:
        await stop.wait()
    finally:
        ticker.cancel()
        lag.cancel()
        await asyncio.gather(ticker, lag, return_exceptions=True)
        reconciler.routes.release_watchers()
        await runner.cleanup()
        fleet.flush_activity()  # what routers reported since the last tick is kept too
        store.close()


async def tick_loop(reconciler: Reconciler, wake: asyncio.Event, tick_s: float, stats) -> None:
    took = 0.0
    while True:
        # A tick runs on the loop: after a long one that took T, the loop is left to heartbeats
        # and reads for T before changes may wake the next, so that a burst of changes (a
        # thousand models applied at once on a large fleet) never holds the loop for more than
        # half.
        if took > PACED_TICK_S:
            await asyncio.sleep(min(took, tick_s))
        try:
            await asyncio.wait_for(wake.wait(), max(0.0, tick_s - took))
        except TimeoutError:
            pass
        wake.clear()
        started = time.perf_counter()
        try:
            reconciler.tick()
        except Exception:  # one bad tick must not stop the control plane
            log.exception("reconcile tick failed")
        stats["ticks"] += 1
        reconciler.fleet.idle.forget_gone()
        took = time.perf_counter() - started
        if took > SLOW_TICK_S:
            log.warning("reconcile tick took %.1f s", took)

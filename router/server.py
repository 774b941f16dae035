"""gpurouter's lifecycle, top to bottom: start, tick, drain on SIGTERM, stop."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from router.control.acks import PromptAcks
from router.control.activity import ActivityReporter
from router.control.catalog import ModelCatalog
from router.control.leader import ControlPlanes
from router.control.routes import RouteWatcher
from router.load.engineload import LoadReader
from router.load.shared import LoadFollower, SharedReadings
from router.path.context import ProxyConfig, ProxyContext
from router.path.fastpath import EndpointTable
from router.path.front import ClientConnection
from router.sdnotify import feed_watchdog, notify
from router.telemetry.metrics import SharedMetrics
from router.tenancy.tenantsfile import read_tenants_file

WAKE_IDS = re.compile(r"[0-9a-f]{32}-[0-9a-f]{16}")  # a trace's and a span's ids, in hex
log = logging.getLogger("gpurouter")
SPANS_LAST_POST_S = 15.0  # at shutdown, for the last spans to reach the collector
ACK_POLL_S = 0.05  # how often the last requests on a replica that left the table are looked at
# How often requests waiting for their tenant's share are looked at, while some wait: a slot
# that a sibling worker frees in the shared in-flight count wakes no waiter here.
SHARE_POLL_S = 0.05


def raise_descriptor_limit() -> int:
    """The soft limit on open descriptors raised to the hard one, as nginx and Envoy do: each
    client, each kept-alive engine connection and each engine read holds one, and the
    default 1,024 runs out on a busy router long before its memory does. Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # kept as it was; the start line says which
    return soft


@dataclass
class RouterSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    static_routes: dict = field(default_factory=dict)
    static_affinity: dict = field(default_factory=dict)  # model -> affinity, from a routes file
    # static mode: SIGHUP reads the routes (and their affinity) again
    reload_routes: Callable[[], tuple[dict, dict]] | None = None
    control_plane: str | None = None
    token: str | None = None
    ca_file: str | None = None  # the CA that signed an https:// control plane's certificate
    router_id: str = ""
    tick_s: float = 2.0
    drain_s: float = 30.0
    reuse_port: bool = False
    max_in_flight: int = 0
    load_factor: float = 1.25  # affinity: how far over the mean a replica's load may go
    load_interval_s: float = 0.1  # how often the engines' own load is read; 0: never
    kv_threshold: float = 0.8  # KV-cache use at which affinity counts a replica as full
    metrics_folder: str | None = None  # with several workers: where they pool their counters
    worker: int = 0
    workers: int = 1  # processes sharing the port
    otlp_endpoint: str | None = None  # traces (router/telemetry/tracing.py); None: off
    trace_sample: float = 0.01
    # tenants without a control plane (router/tenancy/tenantsfile.py)
    tenants_file: str | None = None
    # With a tenants file and several workers: their count of each tenant's requests in flight
    # (router/tenancy/inflight.py), made before they are forked.
    shared_in_flight: object = None
    catalog_every_s: float = 10.0
    proxy: ProxyConfig = field(default_factory=ProxyConfig)


def control_plane_connector(ca_file: str | None):
    """A connector that trusts `ca_file` (and only it) for an https:// control plane."""
    if not ca_file:
        return None
    import ssl

    return aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca_file))


def engine_load_reader(table, settings: RouterSettings):
    """What reads the engines' load for this worker: a LoadReader, or, for workers after the
    first of several, a LoadFollower of the first's readings (router/load/shared.py)."""
    interval = settings.load_interval_s
    if interval <= 0:
        return None
    if not settings.metrics_folder or settings.workers <= 1:
        return LoadReader(table, interval)
    shared = SharedReadings(settings.metrics_folder, settings.worker)
    if settings.worker == 0:
        return LoadReader(table, interval, shared=shared)
    return LoadFollower(table, shared, interval)


class RouterServer:
    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self.table = EndpointTable(
            max_in_flight=settings.max_in_flight,
            load_factor=settings.load_factor,
            kv_threshold=settings.kv_threshold,
        )
        self.load_reader = engine_load_reader(self.table, settings)
        if settings.static_routes:
            self.table.update(settings.static_routes)
        # Stable across restarts, so that a new incarnation supersedes the old one.
        self.router_id = settings.router_id or (
            f"{socket.gethostname()}-{settings.host}:{settings.port}-w{settings.worker}"
        )
        self.incarnation = os.urandom(6).hex()
        self.reporter: ActivityReporter | None = None
        self.report_task: asyncio.Task | None = None  # the tick's report, held until it ends
        self.demands: set[asyncio.Task] = set()
        self.acks = PromptAcks(self.table)  # router/control/acks.py: what is reported at once
        self.report_soon = asyncio.Event()
        self.share_wanted = False  # a request waits for its tenant's share: report now
        self.stopping = asyncio.Event()
        self.started = time.monotonic()

    async def serve(self) -> None:
        settings = self.settings
        loop = asyncio.get_running_loop()
        descriptors = raise_descriptor_limit()
        shared = None
        if settings.metrics_folder:
            shared = SharedMetrics(settings.metrics_folder, settings.worker)
        self.ctx = ctx = ProxyContext(
            self.table,
            settings.proxy,
            router_id=self.router_id,
            incarnation=self.incarnation,
            started=self.started,
            shared_metrics=shared,
            catalog=ModelCatalog(),
        )
        ctx.affinity_by_model = dict(settings.static_affinity)
        if settings.otlp_endpoint:
            from router.telemetry.tracing import Tracing

            ctx.tracing = Tracing(settings.otlp_endpoint, settings.trace_sample)
        if settings.tenants_file:
            ctx.tenants.shared_in_flight = settings.shared_in_flight
            ctx.tenants_changed(
                read_tenants_file(
                    settings.tenants_file, self.router_id, settings.workers, settings.worker
                )
            )
        extra = [
            m.metrics_lines for m in (ctx.tracing, self.load_reader, ctx.resolvers) if m is not None
        ]
        ctx.extra_metrics = lambda: [line for lines in extra for line in lines()]
        if self.load_reader is not None:
            self.load_reader.start()
        server = await loop.create_server(
            lambda: ClientConnection(ctx),
            settings.host,
            settings.port,
            reuse_port=settings.reuse_port,
            backlog=2048,
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        if settings.reload_routes is not None:
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        log.info(
            "gpurouter %s (incarnation %s) listening on http://%s:%d, %d descriptors",
            self.router_id,
            self.incarnation,
            settings.host,
            settings.port,
            descriptors,
        )
        notify("READY=1", f"STATUS=serving on http://{settings.host}:{settings.port}")
        session = aiohttp.ClientSession(connector=control_plane_connector(settings.ca_file))
        if settings.control_plane:
            control_planes = ControlPlanes(settings.control_plane)
            self.reporter = ActivityReporter(
                session,
                control_planes,
                self.router_id,
                self.incarnation,
                self.table,
                settings.token,
                self.started,
                engine_load=self.load_reader.report if self.load_reader else None,
                tenants=ctx.tenants,
                resolvers=ctx.resolvers,
            )
        tasks = [
            asyncio.create_task(self.tick(ctx)),
            asyncio.create_task(self.follow_catalog(ctx, session)),
            asyncio.create_task(feed_watchdog()),
        ]
        if settings.control_plane:

            def routes_changed():
                ctx.affinity_by_model = watcher.affinity
                ctx.tenants_changed(watcher.tenants)
                ctx.resolvers.named = watcher.adapters
                ctx.resolvers.published = watcher.resolvers
                ctx.refresh_routed_models()  # metrics label the new models from now on
                ctx.resume_parked()
                self.acks.routes_changed()
                self.report_soon.set()

            watcher = RouteWatcher(
                session,
                control_planes,
                self.table,
                settings.token,
                on_change=routes_changed,
            )
            watcher.on_answer = lambda: ctx.tenants.heard(ctx.clock())
            tasks.append(asyncio.create_task(watcher.run()))
            ctx.on_demand = lambda model, waiting: self.ask_for(ctx, model, waiting)
            ctx.shares_grow = True
            ctx.on_share_wanted = self.want_share
        try:
            await self.stopping.wait()
        finally:
            notify("STOPPING=1")
            server.close()
            await self.drain(ctx)
            if self.load_reader is not None:
                self.load_reader.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.report_task is not None:
                self.report_task.cancel()
            if self.reporter is not None:
                # The last report says goodbye: the control plane hands this watch on to the
                # next incarnation instead of suspecting a gap.
                await self.reporter.report(ctx.waiting(), goodbye=True)
            for conn in list(ctx.connections):
                conn.close()
            for pool in ctx.pools.values():
                pool.close()
            if ctx.tracing is not None:
                # The last batch of spans goes out before the process ends.
                try:
                    await asyncio.wait_for(ctx.tracing.close(), SPANS_LAST_POST_S)
                except TimeoutError:
                    log.warning("the last spans were not sent within %s s", SPANS_LAST_POST_S)
            await session.close()
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)

    def reload(self) -> None:
        """SIGHUP in static mode: apply the routes file again; a bad file changes nothing."""
        try:
            routes, affinity = self.settings.reload_routes()
            self.table.update(routes)
            self.ctx.affinity_by_model = affinity
            self.ctx.resume_parked()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("routes not reloaded, keeping the current table: %s", exc)
            return
        log.info("routes reloaded: %d model(s)", len(routes))

    async def tick(self, ctx: ProxyContext) -> None:
        """Sweeps deadlines and reports activity once a tick; reports at once, between ticks,
        a new route version and the end of the last request on a replica that left the table
        (router/control/acks.py)."""
        loop = asyncio.get_running_loop()
        period = min(1.0, self.settings.tick_s)
        next_report = next_sweep = loop.time()
        while True:
            now = loop.time()
            if now >= next_sweep:
                next_sweep = now + period
                ctx.sweep()
            if now >= next_report:
                next_report = now + self.settings.tick_s
                ctx.on_tick()
                self.acks.due()  # this report carries it
                self.send_report(ctx)
            elif not self.reporting() and (self.acks.due() or self.share_wanted):
                self.share_wanted = False
                self.send_report(ctx, prompt=True)
            pause = ACK_POLL_S if self.acks.watching else period
            if ctx.share_waiting:
                ctx.admit_all_share_waiters()
                pause = min(pause, SHARE_POLL_S)
            try:
                # Not wait_for, which on Python 3.11 may swallow the stop's cancel when a
                # report is asked for in the same turn: the loop would report on for ever.
                async with asyncio.timeout(pause):
                    await self.report_soon.wait()
            except TimeoutError:
                pass
            self.report_soon.clear()

    def want_share(self) -> None:
        """A request waits for its tenant's share here to grow: the control plane hears what
        this router wants now, not at the next tick."""
        self.share_wanted = True
        self.report_soon.set()

    def reporting(self) -> bool:
        return self.report_task is not None and not self.report_task.done()

    def send_report(self, ctx: ProxyContext, prompt: bool = False) -> None:
        if self.reporter is not None:
            report = self.reporter.report(ctx.waiting(), prompt=prompt)
            self.report_task = asyncio.create_task(report)

    def ask_for(self, ctx: ProxyContext, model: str, waiting: int) -> None:
        """Requests wait for `model`: tell the control plane now, not at the next tick."""

        async def demand():
            traced = [e.trace for e in ctx.parked.get(model, ()) if e.trace is not None]
            parent = traced[0].traceparent_value() if traced else None
            reason, final, wake = await self.reporter.demand(model, waiting, parent)
            if WAKE_IDS.fullmatch("-".join(wake)) and model in ctx.parked:
                ctx.wake_traces[model] = wake  # for those that park from now on
                for exchange in ctx.parked[model]:
                    if exchange.trace is not None:
                        exchange.trace.waited_on(*wake)
            if reason and final:
                ctx.refuse_parked(model, reason)
            elif reason and model in ctx.parked:
                ctx.waiting_reason[model] = reason  # room is being made, or may be: wait

        task = asyncio.create_task(demand())
        self.demands.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self.demands.discard)

    async def follow_catalog(self, ctx: ProxyContext, session) -> None:
        """What the replicas serve (LoRA adapters too), for /v1/models and routing."""
        while True:
            try:
                await ctx.catalog.refresh(session, self.table)
                ctx.refresh_routed_models()
            except Exception:  # the catalog is a convenience: never let it stop the router
                log.exception("model catalog refresh failed")
            await asyncio.sleep(self.settings.catalog_every_s)

    async def drain(self, ctx: ProxyContext) -> None:
        """Let requests in flight finish, up to the drain deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_s
        for conn in list(ctx.connections):
            if conn.exchange is None:
                conn.close()
            else:
                conn.keep_alive = False
        while ctx.in_flight() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if ctx.in_flight():
            log.warning("drain deadline passed with %d request(s) in flight", ctx.in_flight())

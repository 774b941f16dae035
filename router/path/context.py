"""What every client connection of one router process shares: settings, table, pools, metrics."""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from router.control.activity import activity_report
from router.control.catalog import ModelCatalog
from router.control.resolvers import Resolvers, served
from router.path.affinity import DEFAULT_PREFIX_CHARS
from router.path.fairqueue import FairQueue
from router.path.upstream import UpstreamPool
from router.protocol.wire import monotonic, numbered
from router.telemetry.metrics import RouterMetrics, SharedMetrics, merge, render
from router.tenancy.tenantmetrics import merge_tenants, tenant_lines, tenant_state
from router.tenancy.tenants import TenantBook


@dataclass(frozen=True)  # ProxyContext keeps its own copies of the settings read per request
class ProxyConfig:
    max_body_bytes: int = 32 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 600.0  # prefill of a long prompt can take minutes
    idle_timeout_s: float = 120.0  # between two chunks of an answer
    client_timeout_s: float = 30.0  # to send the request's headers and body
    keepalive_timeout_s: float = 75.0
    max_tries: int = 3
    api_keys: tuple[bytes, ...] = ()
    # What /metrics and /activity ask for (Bearer); with tenants and none set, nobody reads
    # them on the client port: they name every tenant and model.
    metrics_token: bytes = b""
    park_max: int = 1000  # requests held per model while it wakes (following a control plane)
    park_timeout_s: float = 600.0  # engines can take minutes to load their weights
    affinity: str = "prefix"  # off | session | prefix: which replica a request prefers
    affinity_prefix_chars: int = DEFAULT_PREFIX_CHARS

    def __post_init__(self) -> None:
        if not 1 <= self.max_tries <= 16:
            raise ValueError("max_tries must be within 1..16")


class ProxyContext:
    """Attributes and the per-request methods are typed in context.pxd."""

    def __init__(
        self,
        table,
        config: ProxyConfig,
        metrics: RouterMetrics | None = None,
        router_id: str = "",
        incarnation: str = "",
        started: float = 0.0,
        shared_metrics: SharedMetrics | None = None,
        catalog: ModelCatalog | None = None,
    ) -> None:
        self.table = table
        self.router_id = router_id
        self.incarnation = incarnation
        self.started = started or time.monotonic()
        self.config = config
        self.metrics = metrics or RouterMetrics()
        self.shared_metrics = shared_metrics
        self.catalog = catalog or ModelCatalog()
        self.pools: dict[str, UpstreamPool] = {}
        self.connections: set = set()
        self.loop = asyncio.get_event_loop()
        # The router's one clock: time.monotonic, which the compiled modules read as a C call
        # (router.protocol.wire.monotonic). The loop's own clock is the same one at millisecond
        # grain, behind a slower call.
        self.clock = monotonic
        self.last_id = 0
        self._id_prefix = f"{os.getpid():x}-{os.urandom(3).hex()}-".encode()
        self.routed_models: frozenset[str] = frozenset()
        self.resolvers = Resolvers()  # adapters an engine may load on a request
        self.adapter_models: frozenset[str] = frozenset()
        self.refresh_routed_models()
        # Waiting for a replica: model -> the exchanges parked for it, and since when. Only
        # with a control plane to wake the model (`on_demand`); without one, 503 at once.
        self.parked: dict[str, deque] = {}
        self.parked_since: dict[str, float] = {}
        # model -> the ids (trace, span) of the control plane's trace of its wake, once its
        # demand was answered: a request that parks later is linked to it too.
        self.wake_traces: dict[str, tuple] = {}
        # model -> why room for it is still being made: what its waiting requests are told if
        # they wait out the park timeout
        self.waiting_reason: dict[str, str] = {}
        self.on_demand: Callable[[str, int], None] | None = None
        self.affinity_by_model: dict[str, str] = {}  # per-model overrides of config.affinity
        # () -> more Prometheus lines of this process (the engine-load reader's)
        self.extra_metrics: Callable[[], list[str]] | None = None
        self.tracing = None  # router/telemetry/tracing.py's Tracing with --otlp-endpoint; else None
        self.trace_countdown = 0  # requests until the next one sampled (Exchange._sampled)
        # Tenants (router/tenancy/tenants.py): --api-keys-file's keys are one, with no limits.
        self.tenants = TenantBook()
        # Waiting for a tenant's share of max_in_flight to grow (a control plane deals the
        # shares: `shares_grow`): tenant -> its exchanges, in arrival order; () -> tell the
        # control plane now what this router wants.
        self.share_waiting: dict[str, deque] = {}
        self.shares_grow = False
        self.on_share_wanted: Callable[[], None] | None = None
        if config.api_keys:
            self.tenants.use_keys_file(config.api_keys, self.clock())
        # Waiting for a slot of a saturated model: model -> FairQueue; how many wait in all.
        self.slot_waiting: dict[str, FairQueue] = {}
        self.slot_waiters = 0
        # Settings read on every request, kept as typed attributes of their own.
        self.keys_required = self.tenants.enabled()
        self.affinity = config.affinity
        self.affinity_prefix_chars = config.affinity_prefix_chars
        self.first_byte_timeout_s = config.first_byte_timeout_s
        self.idle_timeout_s = config.idle_timeout_s
        self.max_tries = config.max_tries

    def new_request_id(self) -> bytes:
        self.last_id += 1
        return numbered(self._id_prefix, self.last_id)

    def pool_for(self, url: str) -> UpstreamPool:
        pool = self.pools.get(url)
        if pool is None:
            pool = self.pools[url] = UpstreamPool(
                url, self.config.connect_timeout_s, loop=self.loop
            )
        return pool

    def refresh_routed_models(self) -> None:
        """The names metrics may carry as labels: the table's models and served adapters (and
        which adapters may be loaded where a request lands)."""
        self.routed_models = frozenset(served(self.table.models())).union(self.catalog.aliases)
        self.resolvers.update(self.table)
        self.adapter_models = self.resolvers.adapters

    def on_tick(self) -> None:
        """Once a tick: what changes slowly is refreshed here, not per request."""
        self.refresh_routed_models()
        self.drop_unused_pools()
        if self.shared_metrics is not None:
            self.shared_metrics.publish(self.metrics_state())

    def drop_unused_pools(self) -> None:
        live = {url for model in self.table.models() for _, _, url in self.table.endpoints(model)}
        for url in list(self.pools):
            if url not in live and not self.pools[url].busy():
                self.pools.pop(url).close()

    def sweep(self) -> None:
        self.admit_all_share_waiters()
        now = self.clock()
        for conn in list(self.connections):
            conn.check_deadlines(now)

    def in_flight(self) -> int:
        return sum(1 for conn in self.connections if conn.exchange is not None)

    def may_read_metrics(self, authorization: bytes | None) -> bool:
        """Whether a request may read /metrics and /activity: with the metrics token when
        one is set; without one, only while no tenant's data is held (no tenants, or the
        fleet asks no key), and /activity then as any request is authorised."""
        token = self.config.metrics_token
        if token:
            given = authorization or b""
            return given.startswith(b"Bearer ") and hmac.compare_digest(given[7:].strip(), token)
        return not (self.tenants.tenants or self.tenants.required) or (
            bool(self.tenants.file_keys) and len(self.tenants.tenants) == 1
        )

    def authorised(self, authorization: bytes | None) -> bool:
        """Whether a request's Authorization header (None: it had none) carries a key."""
        if not self.config.api_keys:
            return True
        given = authorization or b""
        if not given.startswith(b"Bearer "):
            return False
        token = given[7:].strip()
        return any(hmac.compare_digest(token, key) for key in self.config.api_keys)

    # waiting for a replica

    def park(self, exchange) -> bool:
        """Hold `exchange` until its model has a replica; False when none may wait here."""
        if self.on_demand is None:
            return False
        model = exchange.routed_model
        queue = self.parked.setdefault(model, deque())
        if len(queue) >= self.config.park_max:
            return False
        queue.append(exchange)
        self.metrics.parked[model] = len(queue)
        if exchange.trace is not None and model in self.wake_traces:
            exchange.trace.waited_on(*self.wake_traces[model])
        if len(queue) == 1:  # once per wake, not per request
            self.parked_since[model] = self.clock()
            self.on_demand(model, 1)
        return True

    def tenants_changed(self, part: dict) -> None:
        """A routing table's `tenants` part arrived (or none: no tenant is applied): shares
        may have grown for the requests that wait for them."""
        self.tenants.update(part, self.router_id, self.clock())
        self.keys_required = self.tenants.enabled()
        for name in list(self.share_waiting):
            self.admit_share_waiters(name)

    # waiting for a tenant's share

    def wait_for_share(self, exchange) -> None:
        """Hold `exchange` until its tenant's share here admits it (admit_share_waiters) or
        its deadline passes; the control plane hears at once that this router wants more."""
        tenant = exchange.tenant
        queue = self.share_waiting.get(tenant.name)
        if queue is None:
            queue = self.share_waiting[tenant.name] = deque()
        queue.append(exchange)
        tenant.waiting += 1
        if self.on_share_wanted is not None:
            self.on_share_wanted()

    def admit_all_share_waiters(self) -> None:
        """Every tenant's waiting requests that its share now lets in: a rate's bucket refills
        with time, and a sibling worker's finished request frees a slot of the shared count,
        neither of which a table or a request's end here tells."""
        for name in list(self.share_waiting):
            self.admit_share_waiters(name)

    def admit_share_waiters(self, name: str) -> None:
        """Admit the waiting requests of tenant `name` that its share now lets in, first come
        first served (called when a table arrives and when one of its requests ends)."""
        queue = self.share_waiting.get(name)
        if not queue:
            return
        now = self.clock()
        leased = now < self.tenants.lease_until
        while queue:
            exchange = queue[0]
            refused = exchange.tenant.take(now, exchange.reserved, leased)
            if refused:
                exchange.over_share = refused
                break
            queue.popleft()
            exchange.tenant.waiting -= 1
            exchange.share_granted()
        if not queue:
            del self.share_waiting[name]

    # waiting for a slot of a saturated model

    def wait_for_slot(self, exchange) -> bool:
        """Queue `exchange` behind its tenant's others; False when that queue is full."""
        model = exchange.routed_model
        queue = self.slot_waiting.get(model)
        if queue is None:
            queue = self.slot_waiting[model] = FairQueue(self.config.park_max)
        tenant = exchange.tenant
        if tenant is None:
            queued = queue.push(exchange, "", 0, 1.0)
        else:
            queued = queue.push(exchange, tenant.name, tenant.priority, tenant.weight)
        if queued:
            self.slot_waiters += 1
        return queued

    def slot_freed(self, model: str, slots: int = 1) -> None:
        """`slots` of `model` are free: as many waiting requests take them, by priority and
        weight. One that finds no slot after all goes back to wait (and stops the release)."""
        queue = self.slot_waiting.get(model)
        while slots > 0 and queue is not None and queue.size:
            slots -= 1
            exchange = queue.pop()
            self.slot_waiters -= 1
            if not queue.size:
                del self.slot_waiting[model]
            exchange.resume()
            if exchange.stage == 1:  # WAITING again: no slot after all
                return
            queue = self.slot_waiting.get(model)

    def has_slot_waiters(self, model: str) -> bool:
        queue = self.slot_waiting.get(model)
        return queue is not None and queue.size > 0

    def unpark(self, exchange) -> None:
        if exchange.over_share:
            queue = self.share_waiting.get(exchange.tenant.name)
            if queue is not None and exchange in queue:
                queue.remove(exchange)
                exchange.tenant.waiting -= 1
                if not queue:
                    del self.share_waiting[exchange.tenant.name]
            return
        queue = self.slot_waiting.get(exchange.routed_model)
        tenant = exchange.tenant
        if queue is not None and queue.remove(exchange, tenant.name if tenant else ""):
            self.slot_waiters -= 1
            if not queue.size:
                del self.slot_waiting[exchange.routed_model]
            return
        model = exchange.routed_model
        queue = self.parked.get(model)
        if queue is None:
            return
        try:
            queue.remove(exchange)
        except ValueError:
            return
        self.metrics.parked[model] = len(queue)
        if not queue:
            del self.parked[model]
            self.parked_since.pop(model, None)
            self.waiting_reason.pop(model, None)
            self.wake_traces.pop(model, None)

    def resume_parked(self) -> None:
        """After a new routing table: the requests held for models that now have a replica go,
        and those waiting for a slot try the replicas that came."""
        for model in list(self.slot_waiting):
            self.slot_freed(model, self.config.park_max)
        for model in [m for m in self.parked if self.table.endpoints(m)]:
            queue = self.parked.pop(model)
            self.waiting_reason.pop(model, None)
            self.wake_traces.pop(model, None)
            self.metrics.parked[model] = 0
            self.metrics.woke(model, self.clock() - self.parked_since.pop(model))
            for exchange in queue:
                exchange.resume()

    def refuse_parked(self, model: str, reason: str) -> None:
        """The model cannot be placed: its held requests are answered now, with why."""
        queue = self.parked.pop(model, ())
        self.parked_since.pop(model, None)
        self.waiting_reason.pop(model, None)
        self.wake_traces.pop(model, None)
        self.metrics.parked[model] = 0
        for exchange in queue:
            exchange.refuse_waiting(reason)

    def waiting(self) -> dict[str, int]:
        return {model: len(queue) for model, queue in self.parked.items()}

    def metrics_state(self) -> dict:
        """This process's counters, its tenants' included, as its workers share them."""
        state = self.metrics.state()
        state["tenants"] = tenant_state(self.tenants.tenants)
        return state

    def metrics_text(self) -> bytes:
        state = self.metrics_state()
        states = [state] if self.shared_metrics is None else self.shared_metrics.gather(state)
        totals = merge(states)
        table = self.table
        ejected = [
            (model, replica)
            for model in table.models()
            for slot, replica, _ in table.endpoints(model)
            if table.is_ejected(slot)
        ]
        text = render(totals, table, ejected)
        text += tenant_lines(merge_tenants(states, state["tenants"]))
        if self.extra_metrics is not None:
            text += ("\n".join(self.extra_metrics()) + "\n").encode()
        return text

    def activity(self) -> dict:
        return activity_report(
            self.router_id, self.incarnation, self.started, self.table, self.waiting()
        )

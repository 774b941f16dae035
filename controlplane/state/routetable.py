"""The EndpointSink's source: the routing table the control plane publishes to routers."""

from __future__ import annotations

import asyncio
import time

from controlplane.rules.adapters import slot_id
from controlplane.vocabulary.model import ReplicaState


class RouteTable:
    """The EndpointSink's source: {model: [{id, url}]} of Ready replicas, with a version.

    Versions start from the wall clock in milliseconds, so that they keep increasing across a
    control-plane restart and a router never mistakes a new table for one it already has.
    """

    def __init__(self) -> None:
        self.version = int(time.time() * 1000)
        self.routes: dict[str, list[dict]] = {}
        self.affinity: dict[str, str] = {}  # model -> its spec's affinity, where it sets one
        self.tenants: dict = {}  # tenants' rules, shares and key digests (tenantshares.py)
        self.resolvers: dict[str, dict] = {}  # base -> adapters, replicas that may load them
        self.adapters: list[str] = []  # which of the routes are LoRA adapters
        self._changed = asyncio.Event()

    def publish(
        self,
        routes: dict[str, list[dict]],
        affinity: dict | None = None,
        tenants: dict | None = None,
        resolvers: dict | None = None,
        adapters: list | None = None,
    ) -> bool:
        affinity = affinity or {}
        tenants = tenants or {}
        resolvers = resolvers or {}
        adapters = adapters or []
        if (routes, affinity, tenants, resolvers, adapters) == (
            self.routes, self.affinity, self.tenants, self.resolvers, self.adapters
        ):  # fmt: skip
            return False
        self.adapters = adapters
        self.routes = routes
        self.affinity = affinity
        self.tenants = tenants
        self.resolvers = resolvers
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    def release_watchers(self) -> None:
        """Answer every waiting watch now, with the table as it is: a server that is stopping
        would otherwise wait out its drain deadline on routers' long polls."""
        self._changed.set()
        self._changed = asyncio.Event()

    def as_json(self) -> dict:
        table = {"version": self.version, "routes": self.routes, "affinity": self.affinity}
        if self.tenants:
            table["tenants"] = self.tenants
        if self.resolvers:
            table["resolvers"] = self.resolvers
        if self.adapters:
            table["adapters"] = self.adapters
        return table

    async def wait_for_change(self, after: int, timeout: float) -> dict:
        if after == self.version:
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait()
            except TimeoutError:
                pass
        return self.as_json()


def routing_table(specs: dict, adapters: dict, replicas: dict) -> tuple[dict, dict]:
    """{model: [{id, url}]} of Ready replicas (an adapter's endpoints are its holders), and
    each model's affinity where its spec sets one (an adapter's is its base's). See also
    `resolvers`."""
    routes: dict[str, list[dict]] = {name: [] for name in sorted(specs)}
    for name in sorted(adapters):
        routes[name] = []
    for replica in sorted(replicas.values(), key=lambda r: r.id):
        if replica.state != ReplicaState.READY or not replica.url:
            continue
        if replica.model in routes:
            routes[replica.model].append({"id": replica.id, "url": replica.url})
        for name in replica.want_adapters:
            if name in replica.adapters and name in routes:
                routes[name].append({"id": slot_id(replica.id, name), "url": replica.url})
    affinity = {s.name: s.affinity for s in specs.values() if s.affinity is not None}
    for adapter in adapters.values():
        if adapter.base in affinity:
            affinity[adapter.name] = affinity[adapter.base]
    return routes, affinity


def resolvers(specs: dict, adapters: dict, replicas: dict) -> dict[str, dict]:
    """{base: {"adapters": [name], "replicas": [{id, url, taken}]}} for each base whose engines
    load adapters themselves (`adapter_resolver`): its adapters that may be loaded where a
    request lands, and its Ready replicas with a free adapter slot, each with the adapters it
    holds, is ordered to load or is unloading (`taken`), which it is not sent as a resolver. A
    router sends a request for an adapter to one of them when no holder can take it at once.
    An adapter that failed to load anywhere is left out until it is applied again: its
    requests wait for the control plane's own placement.

    Kept per base, not per adapter, so that the table grows with adapters plus replicas (and
    their few slots), never with adapters times replicas."""
    failed = {name for r in replicas.values() for name in r.adapter_failures}
    resolvable: dict[str, list[str]] = {}
    for adapter in sorted(adapters.values(), key=lambda a: a.name):
        base = specs.get(adapter.base)
        if base is not None and base.adapter_resolver and adapter.name not in failed:
            resolvable.setdefault(adapter.base, []).append(adapter.name)
    out: dict[str, dict] = {}
    for base_name, names in resolvable.items():
        room = specs[base_name].max_adapters
        free = [
            {"id": r.id, "url": r.url, "taken": sorted({*r.want_adapters, *r.unloading})}
            for r in sorted(replicas.values(), key=lambda r: r.id)
            if r.model == base_name
            and r.state == ReplicaState.READY
            and r.url
            and len(r.want_adapters) + len(r.unloading) < room
        ]
        if free:
            out[base_name] = {"adapters": names, "replicas": free}
    return out


def resolver_endpoints(published: dict, adapter: str) -> list[dict]:
    """[{id, url}] of the replicas a router may send a request for `adapter` to, each under
    the id the adapter would have there, from a table's `resolvers`."""
    for entry in published.values():
        if adapter in entry["adapters"]:
            return [
                {"id": slot_id(r["id"], adapter), "url": r["url"]}
                for r in entry["replicas"]
                if adapter not in r["taken"]
            ]
    return []

"""Adapters that an engine loads itself: where a router may send a request for an adapter that
no holder can take at once.

The control plane publishes, beside an adapter's routes (its holders, `REPLICA@ADAPTER`), per
base whose engines run with a LoRA resolver: its adapters that may be loaded on a first
request, and its replicas with a free adapter slot, each with the adapters it holds or is
busy loading or unloading (`taken`; `resolvers` in the table). The route watcher puts each
base's replicas in the endpoint table as a route of their own, BASE + SUFFIX, which no client
can name (a model's name holds no `@`) and which no listing shows. A request for the adapter
takes a holder when one can take it at once; else the least-loaded replica of that route that
has not taken the adapter, whose engine loads it and serves it (the control plane learns the
holding from the engine and publishes it as a holder from then on); else it waits for the
control plane, as before. One route per base, not per adapter: the table a router holds grows
with adapters plus replicas.

An engine that answers such a request 404 could not load the adapter: this router sends it to
no resolver again until its table changes, and its next report names the replica and the
adapter, so that the control plane takes the adapter out of the resolvers until it is applied
again: later requests wait for the control plane's own placement.
"""

from __future__ import annotations

SUFFIX = "@resolver"
SEP = "@"  # REPLICA@ADAPTER, as the control plane names an adapter's place
WAYS = ("holder", "resolver", "waited")


def resolver_route(base: str) -> str:
    return base + SUFFIX


def served(models) -> list[str]:
    """The table's models a client may name: its resolver routes left out."""
    return [m for m in models if not m.endswith(SUFFIX)]


def checked_resolvers(published) -> dict[str, dict]:
    """The table's `resolvers`, each base's entry kept only if it has the published shape."""
    if not isinstance(published, dict):
        return {}
    kept = {}
    for base, entry in published.items():
        try:
            adapters = [a for a in entry["adapters"] if isinstance(a, str)]
            replicas = [
                {"id": r["id"], "url": r["url"], "taken": [a for a in r.get("taken", ())]}
                for r in entry["replicas"]
                if isinstance(r["id"], str) and isinstance(r["url"], str)
            ]
        except (KeyError, TypeError):
            continue
        kept[base] = {"adapters": adapters, "replicas": replicas}
    return kept


def with_resolvers(routes: dict, resolvers: dict) -> dict:
    """The routes with each base's resolvers as a route of its own."""
    merged = dict(routes)
    for base, entry in resolvers.items():
        if base in routes:
            merged[resolver_route(base)] = [
                {"id": r["id"], "url": r["url"]} for r in entry["replicas"]
            ]
    return merged


class Resolvers:
    def __init__(self) -> None:
        self.routes: dict[str, str] = {}  # adapter -> its base's resolver route in the table
        self.taken: dict[str, tuple] = {}  # adapter -> slots of that route not to send it to
        self.adapters: frozenset[str] = frozenset()  # models whose endpoints are adapters'
        self.named: frozenset[str] = frozenset()  # the adapters the control plane names
        self.published: dict[str, dict] = {}  # the table's resolvers (checked_resolvers)
        self.given_up: set[str] = set()  # adapters a resolver failed, until the next table
        self.failures: dict[str, str] = {}  # REPLICA@ADAPTER -> why, until reported
        self.ways = dict.fromkeys(WAYS, 0)
        self._version = None

    def update(self, table) -> None:
        """After a new table, and once a tick: which models are adapters, which of them may be
        resolved, on which route, and where not."""
        if table.version != self._version:
            self._version = table.version
            self.given_up.clear()
        models = set(table.models())
        routes: dict[str, str] = {}
        taken: dict[str, list[int]] = {}
        for base, entry in self.published.items():
            route = resolver_route(base)
            slot_of = {endpoint_id: slot for slot, endpoint_id, _ in table.endpoints(route)}
            if not slot_of:
                continue
            for adapter in entry["adapters"]:
                if adapter in models and adapter not in self.given_up:
                    routes[adapter] = route
            for replica in entry["replicas"]:
                slot = slot_of.get(replica["id"])
                for adapter in replica["taken"] if slot is not None else ():
                    taken.setdefault(adapter, []).append(slot)
        self.routes = routes
        self.taken = {adapter: tuple(slots) for adapter, slots in taken.items()}
        self.adapters = frozenset(
            m
            for m in models
            if not m.endswith(SUFFIX)
            and (
                m in self.named
                or m in routes
                or any(SEP in e for _, e, _ in table.endpoints(m))
            )
        )

    def route_of(self, adapter: str) -> str | None:
        return self.routes.get(adapter)

    def failed(self, adapter: str, replica_id: str, status: int) -> None:
        """A resolver could not load `adapter`: none is tried for it until the next table."""
        self.routes.pop(adapter, None)
        self.given_up.add(adapter)
        self.failures[replica_id + SEP + adapter] = f"HTTP {status}"

    def reported(self, sent: dict) -> None:
        for endpoint_id in sent:
            self.failures.pop(endpoint_id, None)

    def metrics_lines(self) -> list[str]:
        lines = [
            "# HELP gpurouter_adapter_requests_total Requests for LoRA adapters by the way they"
            " were served: by a replica holding the adapter, by one whose engine loaded it on"
            " the request (a resolver), or after waiting for the control plane to load it.",
            "# TYPE gpurouter_adapter_requests_total counter",
        ]
        for way, count in self.ways.items():
            lines.append(f'gpurouter_adapter_requests_total{{way="{way}"}} {count}')
        return lines

"""Adapters that an engine loads itself: where a router may send a request for an adapter that
no holder can take at once.

The control plane publishes, beside an adapter's routes (its holders, `REPLICA@ADAPTER`), the
replicas of its base that may load it on a first request (`resolvers` in the table: bases
whose engines run with a LoRA resolver, replicas with a free adapter slot). The route watcher
puts them in the endpoint table as a route of their own, ADAPTER + SUFFIX, which no client
can name (a model's name holds no `@`) and which no listing shows. A request for the adapter
takes a holder when one can take it at once; else the least-loaded of these, whose engine
loads the adapter and serves it (the control plane learns the holding from the engine and
publishes it as a holder from then on); else it waits for the control plane, as before.

An engine that answers such a request 404 could not load the adapter: this router sends it to
no resolver again until its table changes, and its next report names the replica and the
adapter, so that the control plane takes them out of the resolvers until the adapter is
applied again: later requests wait for the control plane's own placement.
"""

from __future__ import annotations

SUFFIX = "@resolver"
WAYS = ("holder", "resolver", "waited")


def resolver_route(adapter: str) -> str:
    return adapter + SUFFIX


def served(models) -> list[str]:
    """The table's models a client may name: its resolver routes left out."""
    return [m for m in models if not m.endswith(SUFFIX)]


def with_resolvers(routes: dict, resolvers: dict) -> dict:
    """The routes with each adapter's resolvers as a route of its own."""
    merged = dict(routes)
    for adapter, endpoints in resolvers.items():
        if adapter in routes:
            merged[resolver_route(adapter)] = endpoints
    return merged


class Resolvers:
    def __init__(self) -> None:
        self.routes: dict[str, str] = {}  # adapter -> its resolver route in the table
        self.adapters: frozenset[str] = frozenset()  # models whose endpoints are adapters'
        self.named: frozenset[str] = frozenset()  # the adapters the control plane names
        self.failures: dict[str, str] = {}  # REPLICA@ADAPTER -> why, until reported
        self.ways = dict.fromkeys(WAYS, 0)

    def update(self, table) -> None:
        """After a new table: which models are adapters, and which have resolvers."""
        models = table.models()
        self.routes = {
            m[: -len(SUFFIX)]: m for m in models if m.endswith(SUFFIX) and table.endpoints(m)
        }
        self.adapters = frozenset(
            m
            for m in models
            if not m.endswith(SUFFIX)
            and (
                m in self.named
                or m in self.routes
                or any("@" in e for _, e, _ in table.endpoints(m))
            )
        )

    def route_of(self, adapter: str) -> str | None:
        return self.routes.get(adapter)

    def failed(self, adapter: str, endpoint_id: str, status: int) -> None:
        """A resolver could not load `adapter`: none is tried for it until the next table."""
        self.routes.pop(adapter, None)
        self.failures[endpoint_id] = f"HTTP {status}"

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

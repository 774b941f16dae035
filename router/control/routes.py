"""Where the routing table comes from: static flags or a file, or the control plane.

The route watcher long-polls `GET /v1/routes?after=VERSION` and feeds every new table to the
EndpointSink (the EndpointTable). When the control plane cannot be reached it keeps the last
table and tries again with a growing pause: requests never wait on it.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import aiohttp
import yaml

from router.control.resolvers import checked_resolvers, with_resolvers

log = logging.getLogger("gpurouter.routes")


class BadRoute(ValueError):
    pass


def check_url(url: str) -> str:
    """The URL as the router will use it, or BadRoute saying what is wrong with it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadRoute(f"{url!r}: {exc}") from None
    if parts.scheme != "http":
        raise BadRoute(f"{url!r}: only http:// replicas are supported")
    if not parts.hostname:
        raise BadRoute(f"{url!r}: no host")
    if port == 0:
        raise BadRoute(f"{url!r}: port 0")
    if parts.query or parts.fragment:
        raise BadRoute(f"{url!r}: a replica URL has no query or fragment")
    return url.rstrip("/")


def checked_routes(routes: dict) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """(routes without the endpoints whose URL is unusable, one problem line for each)."""
    good: dict[str, list[tuple[str, str]]] = {}
    problems = []
    for model, endpoints in routes.items():
        good[model] = []
        for endpoint_id, url in endpoints:
            try:
                good[model].append((endpoint_id, check_url(url)))
            except BadRoute as exc:
                problems.append(f"model {model!r}, endpoint {endpoint_id!r}: {exc}")
    return good, problems


AFFINITY_MODES = ("off", "session", "prefix")


def read_routes_file(path: str) -> dict:
    with open(path) as f:
        try:
            loaded = yaml.safe_load(f) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping of model to a list of URLs")
    return loaded.get("models", loaded)


def static_config(
    backends: list[str], routes_file: str | None
) -> tuple[dict[str, list[tuple[str, str]]], dict[str, str]]:
    """(routes, per-model affinity) from `--backend` flags and a routes file, read once so that
    both come from the same version of the file."""
    entries = read_routes_file(routes_file) if routes_file else {}
    return static_routes(backends, entries, routes_file), static_affinity(entries, routes_file)


def static_affinity(entries: dict, source: str | None) -> dict[str, str]:
    """Per-model affinity from a routes file's {model: {endpoints, affinity}} entries."""
    chosen = {}
    for model, entry in entries.items():
        if isinstance(entry, dict) and "affinity" in entry:
            # YAML 1.1 reads a bare `off` as false.
            mode = "off" if entry["affinity"] is False else entry["affinity"]
            if mode not in AFFINITY_MODES:
                choices = ", ".join(AFFINITY_MODES)
                raise ValueError(f"{source}: model {model!r}: affinity is one of {choices}")
            chosen[str(model)] = mode
    return chosen


def static_routes(
    backends: list[str], entries: dict, source: str | None
) -> dict[str, list[tuple[str, str]]]:
    """Routes from `--backend MODEL=URL` flags and a routes file's {model: [url | {id, url}]}
    (or {model: {endpoints: [...], affinity: off|session|prefix}}) entries."""
    routes: dict[str, list[tuple[str, str]]] = {}
    for model, entry in entries.items():
        endpoints = entry.get("endpoints") if isinstance(entry, dict) else entry
        if not isinstance(endpoints, list):
            raise ValueError(f"{source}: model {model!r} needs a list of endpoints")
        routes.setdefault(str(model), [])
        for endpoint in endpoints:
            if isinstance(endpoint, dict):
                routes[str(model)].append(
                    (str(endpoint.get("id") or endpoint["url"]), str(endpoint["url"]))
                )
            else:
                routes[str(model)].append((str(endpoint), str(endpoint)))
    for flag in backends:
        model, sep, url = flag.partition("=")
        if not sep or not model or not url.startswith("http://"):
            raise BadRoute(f"--backend takes MODEL=http://HOST:PORT, got {flag!r}")
        routes.setdefault(model, []).append((url, url.rstrip("/")))
    routes, problems = checked_routes(routes)
    if problems:
        raise BadRoute("bad route: " + "; ".join(problems))
    return routes


# A watch parks on the server for WATCH_WAIT_S and is given up WATCH_MARGIN_S later: a frozen
# leader (SIGSTOP, a black-holed route) costs the table at most that before the watch moves on,
# within a lease TTL (5 s by default) and a second, where a watch of 30 s + 10 cost 40 s.
WATCH_WAIT_S = 4.0
WATCH_MARGIN_S = 1.0
MAX_BACKOFF_S = 1.0  # after a failure: an election takes about a lease TTL


class RouteWatcher:
    """Follows the control plane's routing table and applies each version to `sink`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        control_planes,
        sink,
        token: str | None,
        wait_s: float = WATCH_WAIT_S,
        on_change=None,
    ) -> None:
        self.session = session
        self.control_planes = control_planes  # router/control/leader.py
        self.sink = sink
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.wait_s = wait_s
        self.version = -1
        self.affinity: dict[str, str] = {}  # per-model affinity the control plane publishes
        self.tenants: dict = {}  # tenants' rules, this router's shares, keys' digests
        self.adapters: frozenset[str] = frozenset()  # which routes are LoRA adapters
        self.resolvers: dict[str, dict] = {}  # per base: adapters its engines may load
        self.on_change = on_change  # called after each new table is applied
        self.on_answer = None  # called after every answer of the control plane

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                base = self.control_planes.url
                url = f"{base}/v1/routes?after={self.version}&wait={self.wait_s}"
                timeout = aiohttp.ClientTimeout(total=self.wait_s + WATCH_MARGIN_S)
                async with self.session.get(url, headers=self.headers, timeout=timeout) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                    table = await resp.json()
                    self.control_planes.answered(resp)
                backoff = 0.2
                if self.on_answer is not None:
                    self.on_answer()
                if table["version"] != self.version:
                    self.apply(table)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control plane may be down: keep the last table
                log.warning(
                    "route watch of %s failed (%s); serving version %s", base, exc, self.version
                )
                self.control_planes.failed(base)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def apply(self, table: dict) -> None:
        resolvers = checked_resolvers(table.get("resolvers"))
        published = with_resolvers(table["routes"], resolvers)
        routes, problems = checked_routes(
            {
                model: [(e["id"], e["url"]) for e in endpoints]
                for model, endpoints in published.items()
            }
        )
        for problem in problems:
            log.error("route version %s: endpoint left out, %s", table["version"], problem)
        self.sink.update(routes, version=table["version"])
        self.version = table["version"]
        self.affinity = {
            model: mode
            for model, mode in (table.get("affinity") or {}).items()
            if mode in AFFINITY_MODES
        }
        self.tenants = table.get("tenants") or {}
        self.resolvers = resolvers
        adapters = table.get("adapters")
        self.adapters = frozenset(a for a in adapters if isinstance(a, str)) if isinstance(
            adapters, list
        ) else frozenset()  # fmt: skip
        if self.on_change is not None:
            self.on_change()

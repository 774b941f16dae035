"""The control plane's HTTP API (aiohttp), versioned under /v1/. Reference: docs/api.md."""

from __future__ import annotations

import time

from aiohttp import web

from controlplane.api.agents import delete_node, get_assignments, heartbeat, register_node
from controlplane.api.operators import (
    apply_adapter,
    apply_model,
    delete_adapter,
    delete_model,
    get_adapter,
    get_leader,
    get_model,
    get_node,
    get_summary,
    healthz,
    list_adapters,
    list_models,
    list_nodes,
    list_replicas,
    metrics,
    scale_model,
    set_node_state,
    stop_idle,
)
from controlplane.api.plumbing import (
    LEADERSHIP_KEY,
    METRICS_ROUTE_KEY,
    METRICS_TOKEN_KEY,
    NEEDS_KEY,
    TOKENS_KEY,
    authorization,
    errors,
    leader_only,
)
from controlplane.api.routers import (
    forget_router,
    get_routes,
    list_routers,
    post_activity,
    post_demand,
)
from controlplane.api.tenants import (
    apply_tenant,
    create_key,
    delete_tenant,
    get_tenant,
    get_usage,
    list_tenants,
    revoke_key,
)
from controlplane.vocabulary.auth import NODE, PUBLIC, READ

# Every route and who may call it: a route added here cannot be left without a rule, and the
# tests walk this table.
ROUTES = [
    ("GET", "/healthz", healthz, (PUBLIC,)),
    ("GET", "/metrics", metrics, (PUBLIC,)),  # no secret in it; --metrics-token protects it
    ("GET", "/v1/leader", get_leader, (PUBLIC,)),  # a load balancer's health check
    ("GET", "/v1/routes", get_routes, ("router",)),
    ("POST", "/v1/activity", post_activity, ("router",)),
    ("POST", "/v1/demand", post_demand, ("router",)),
    ("POST", "/v1/stop-idle", stop_idle, ("admin",)),
    ("GET", "/v1/routers", list_routers, READ),
    ("DELETE", "/v1/routers/{id}", forget_router, ("admin",)),
    ("POST", "/v1/nodes", register_node, ("agent", NODE)),
    ("GET", "/v1/nodes", list_nodes, READ),
    ("GET", "/v1/nodes/{name}", get_node, READ),
    ("DELETE", "/v1/nodes/{name}", delete_node, ("admin",)),
    ("POST", "/v1/nodes/{name}/heartbeat", heartbeat, (NODE,)),
    ("GET", "/v1/nodes/{name}/assignments", get_assignments, (NODE,)),
    ("POST", "/v1/nodes/{name}/{action}", set_node_state, ("admin",)),
    ("GET", "/v1/models", list_models, READ),
    ("POST", "/v1/models", apply_model, ("admin",)),
    ("GET", "/v1/models/{name}", get_model, READ),
    ("DELETE", "/v1/models/{name}", delete_model, ("admin",)),
    ("POST", "/v1/models/{name}/scale", scale_model, ("admin",)),
    ("GET", "/v1/adapters", list_adapters, READ),
    ("POST", "/v1/adapters", apply_adapter, ("admin",)),
    ("GET", "/v1/adapters/{name}", get_adapter, READ),
    ("DELETE", "/v1/adapters/{name}", delete_adapter, ("admin",)),
    ("GET", "/v1/tenants", list_tenants, READ),
    ("POST", "/v1/tenants", apply_tenant, ("admin",)),
    ("GET", "/v1/tenants/{name}", get_tenant, READ),
    ("DELETE", "/v1/tenants/{name}", delete_tenant, ("admin",)),
    ("POST", "/v1/tenants/{name}/keys", create_key, ("admin",)),
    ("DELETE", "/v1/keys/{id}", revoke_key, ("admin",)),
    ("GET", "/v1/usage", get_usage, READ),
    ("GET", "/v1/replicas", list_replicas, READ),
    ("GET", "/v1/summary", get_summary, READ),
]


# Changes that are traffic, not an operator's: a span each would be a span per heartbeat.
NOT_CHANGES = {"/v1/nodes/{name}/heartbeat", "/v1/activity", "/v1/demand", "/v1/nodes"}


def traced_changes(tracing):
    """A span per API change (controlplane/tick/tracing.py), with its answer's status."""

    @web.middleware
    async def traced(request: web.Request, handler):
        route = request.match_info.route.resource
        path = route.canonical if route is not None else request.path
        if request.method not in ("POST", "PUT", "DELETE") or path in NOT_CHANGES:
            return await handler(request)
        began = time.time_ns()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            tracing.change(request.method, path, status, began)

    return traced


def build_app(
    leadership, tokens: dict[str, str], metrics_token: str | None = None, tracing=None
) -> web.Application:
    """`leadership`: a Sole or an Elected (controlplane/tick/leadership.py), whose term the API
    acts on; `tracing`: spans of API changes, or None."""
    tokens = dict(tokens)
    middlewares = [errors, leader_only, authorization]
    if tracing is not None:
        middlewares.insert(0, traced_changes(tracing))
    app = web.Application(middlewares=middlewares, client_max_size=16 * 1024 * 1024)
    app[LEADERSHIP_KEY] = leadership
    app[TOKENS_KEY] = tokens
    app[METRICS_TOKEN_KEY] = metrics_token or ""
    app[NEEDS_KEY] = {}
    for method, path, handler, needs in ROUTES:
        route = app.router.add_route(method, path, handler)
        app[NEEDS_KEY][route] = needs
    metrics_route = next(r for r in app[NEEDS_KEY] if r.resource.canonical == "/metrics")
    app[METRICS_ROUTE_KEY] = metrics_route
    if metrics_token:
        app[NEEDS_KEY][metrics_route] = ("metrics", "viewer")
    return app

"""The control plane's HTTP API (aiohttp), versioned under /v1/. Reference: docs/api.md."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from controlplane.auth import NO_CREDENTIALS, NODE, PUBLIC, READ, Denied, check, identify
from controlplane.explain import explain
from controlplane.fleet import BadRequest, Conflict, NotFound
from controlplane.idle import ReportError
from controlplane.leadership import Term
from controlplane.metrics import exposition
from controlplane.model import ReplicaState, Schedulable, SpecError, parse_duration
from controlplane.paging import BadPage, bounds, page
from controlplane.redact import public_spec
from controlplane.scaling import plan_stop_idle
from controlplane.store import OutcomeUnknown, StoreUnavailable
from controlplane.summary import adapter_rows, model_rows, node_rows, replica_rows, summary

TOKENS_KEY = web.AppKey("tokens", dict)
METRICS_TOKEN_KEY = web.AppKey("metrics_token", str)
NEEDS_KEY = web.AppKey("needs", dict)  # route -> the roles that may call it
METRICS_ROUTE_KEY = web.AppKey("metrics_route", object)
LEADERSHIP_KEY = web.AppKey("leadership", object)
CALLER_KEY = "caller"
TERM_KEY = "term"
# Answered by every server, leader or standby: for load balancers, probes and scrapers.
LOCAL_PATHS = {"/healthz", "/v1/leader", "/metrics"}
RETRY_AFTER_S = "1"
LEADER_FAMILY = (
    "# HELP gpufleet_leader Whether this server leads (1) or stands by (0).\n"
    "# TYPE gpufleet_leader gauge\ngpufleet_leader {}\n"
)
# How long a demand waits for the tick that places its model before it answers as things are.
DEMAND_WAIT_S = 5.0
# A list this long or longer is encoded in a worker thread: 16,000 nodes are 10 MB of JSON.
LONG_LIST = 1000


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.field = status, message, kind, field


JSON = "application/json"


def json_response(payload, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type=JSON)


def error_response(status: int, message: str, kind: str, field: str | None = None):
    return json_response(
        {"error": {"message": message, "type": kind, "param": field, "code": status}}, status
    )


@web.middleware
async def errors(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, exc.kind, exc.field)
    except BadRequest as exc:
        return error_response(400, str(exc), "invalid_request", exc.field)
    except NotFound as exc:
        return error_response(404, str(exc), "not_found")
    except Conflict as exc:
        return error_response(409, str(exc), "conflict")
    except Denied as exc:
        kind = "unauthorized" if exc.status == 401 else "forbidden"
        return error_response(exc.status, exc.message, kind)
    except SpecError as exc:
        return error_response(400, str(exc), "invalid_request", exc.field)


def term(request: web.Request) -> Term:
    """The leader's working state for this request (leader_only has checked there is one)."""
    return request[TERM_KEY]


def unavailable(message: str) -> web.Response:
    response = error_response(503, message, "unavailable")
    response.headers["Retry-After"] = RETRY_AFTER_S
    return response


@web.middleware
async def leader_only(request: web.Request, handler):
    """Only the leader acts. A standby sends each call to the leader (307, which keeps the
    method and body), or answers 503 while there is none. On the leader, nothing leaves before
    the changes it reveals are committed: a store that cannot commit answers 503, and the
    change was not acknowledged."""
    leadership = request.app[LEADERSHIP_KEY]
    current = leadership.term
    if request.path in LOCAL_PATHS:
        request[TERM_KEY] = current
        return await handler(request)
    if current is None:
        url = leadership.leader_url
        if url:
            raise web.HTTPTemporaryRedirect(url.rstrip("/") + request.path_qs)
        return unavailable("no control plane leads at the moment: an election is under way")
    request[TERM_KEY] = current
    response = await handler(request)
    try:
        await current.fleet.store.sync()
    except OutcomeUnknown as exc:
        # Not a 503: a client must not send it again as if it had not been made.
        return error_response(
            504,
            f"the change may or may not have been stored ({exc}): read the state to see",
            "outcome_unknown",
        )
    except StoreUnavailable as exc:
        return unavailable(f"the change could not be stored ({exc}); it was not made")
    return response


@web.middleware
async def authorization(request: web.Request, handler):
    """Every route says who may call it (ROUTES); with no token file, nobody needs one, and a
    --metrics-token alone guards /metrics and nothing else."""
    tokens = request.app[TOKENS_KEY]
    route = request.match_info.route
    needs = request.app[NEEDS_KEY].get(route)
    if request.app[METRICS_TOKEN_KEY] and route is request.app[METRICS_ROUTE_KEY]:
        tokens = {**tokens, "metrics": request.app[METRICS_TOKEN_KEY]}
    if not tokens or needs is None:  # open, or no such route (404/405 follow)
        return await handler(request)
    current = request[TERM_KEY]
    credentials = current.fleet.credentials if current is not None else NO_CREDENTIALS
    caller = identify(request.headers.get("Authorization", ""), tokens, credentials)
    # A path that names no node (registration) is about the caller's own: its handler checks
    # the node the body names.
    check(caller, needs, request.match_info.get("name", caller.node if caller else None))
    request[CALLER_KEY] = caller
    return await handler(request)


async def body_of(request: web.Request):
    raw = await request.read()
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", "invalid_request") from None


def items(kind: str, rows: list) -> dict:
    return {"kind": kind, "apiVersion": "v1", "items": rows}


def wake(request: web.Request) -> None:
    term(request).wake.set()


# routers


async def get_routes(request: web.Request) -> web.Response:
    try:
        after = int(request.query.get("after", "-1"))
        wait = min(float(request.query.get("wait", "0")), 60.0)
    except ValueError:
        raise ApiError(
            400, "after must be an integer and wait a number of seconds", "invalid_request", "after"
        ) from None
    table = term(request).reconciler.routes
    return json_response(await table.wait_for_change(after, wait))


async def post_demand(request: web.Request) -> web.Response:
    """A router holds requests for a model with no ready replica: wake it if it sleeps, and
    say at once when it cannot be placed (the router then answers its requests with why)."""
    body = await body_of(request)
    if not isinstance(body, dict):
        raise ApiError(400, "expected a JSON object: {model, waiting}", "invalid_request")
    model, waiting = body.get("model"), body.get("waiting", 1)
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model: required, a string", "invalid_request", "model")
    if isinstance(waiting, bool) or not isinstance(waiting, int) or waiting < 0:
        raise ApiError(400, "waiting: a non-negative integer", "invalid_request", "waiting")
    fleet = term(request).fleet
    if model in fleet.adapters:
        return await adapter_demand(request, model, waiting)
    spec = fleet.demand(model, waiting)
    fleet.flush_records()  # stored before the answer, as every change is

    def ready() -> int:
        return sum(
            1 for r in fleet.replicas.values() if r.model == model and r.state == ReplicaState.READY
        )

    if fleet.changed or not ready():
        # Placed, or room made for it, by the next tick (paced as every tick is): the answer
        # carries the outcome.
        await term(request).after_next_tick(DEMAND_WAIT_S)
    reason = fleet.reasons.get(model, "")
    room = fleet.room.get(model)
    return json_response(
        {
            "model": model,
            "desired": fleet.desired(spec),
            "ready": ready(),
            "reason": reason,
            # final: no room can be made for it (the router answers its requests now); else
            # room is being made or may be later (the router keeps them waiting).
            "final": bool(reason) and (room is None or room["final"]),
        }
    )


async def adapter_demand(request: web.Request, name: str, waiting: int) -> web.Response:
    """Requests wait for an adapter no replica serves: it is loaded by the next tick (its base
    woken first if it is at zero), and the answer says where it stands."""
    fleet = term(request).fleet
    fleet.adapter_demand(name, waiting)
    fleet.flush_records()

    def loaded() -> int:
        return sum(
            1
            for r in fleet.replicas.values()
            if name in r.want_adapters and name in r.adapters and r.state == ReplicaState.READY
        )

    if not loaded():
        await term(request).after_next_tick(DEMAND_WAIT_S)
    return json_response(
        {
            "model": name,
            "desired": 1,
            "ready": loaded(),
            "reason": fleet.adapter_reasons.get(name, ""),
            "final": False,  # an adapter waits for a holder; the park timeout bounds it
        }
    )


async def list_adapters(request: web.Request) -> web.Response:
    rows = await view(request, "adapters", adapter_rows)
    base = request.query.get("base")
    if base:
        rows = [r for r in rows if r["base"] == base]
    return await paged_list(request, "AdapterList", rows, lambda r: (r["name"],))


async def get_adapter(request: web.Request) -> web.Response:
    fleet = term(request).fleet
    adapter = fleet.adapter(request.match_info["name"])
    rows = await view(request, "adapters", adapter_rows)
    row = next(r for r in rows if r["name"] == adapter.name)
    events = [{"at": at, "message": text} for at, text in fleet.events.get(adapter.name, ())]
    return json_response({**row, "events": events})


async def apply_adapter(request: web.Request) -> web.Response:
    dry_run = request.query.get("dry_run", "") in ("1", "true")
    adapter, outcome = term(request).fleet.apply_adapter(await body_of(request), dry_run)
    if not dry_run:
        wake(request)
    answer = {"adapter": adapter.to_dict(), "result": outcome}
    if dry_run:
        answer["dry_run"] = True
    return json_response(answer, 201 if outcome == "created" and not dry_run else 200)


async def delete_adapter(request: web.Request) -> web.Response:
    adapter = term(request).fleet.delete_adapter(request.match_info["name"])
    wake(request)
    return json_response({"adapter": adapter.to_dict(), "result": "deleted"})


async def stop_idle(request: web.Request) -> web.Response:
    """`gpuctl stop-idle`: the scale-down rules, once, on an operator's word."""
    body = await body_of(request)
    if not isinstance(body, dict):
        raise ApiError(400, "expected a JSON object", "invalid_request")
    try:
        idle_after = (
            parse_duration(body["idle_after"], "idle_after") if body.get("idle_after") else None
        )
    except SpecError as exc:
        raise ApiError(400, str(exc), "invalid_request", "idle_after") from None
    models = body.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ApiError(400, "models: a list of model names", "invalid_request", "models")
    fleet = term(request).fleet
    for name in models:
        fleet.spec(name)  # 404 for a model that does not exist
    outcome = plan_stop_idle(fleet, models, idle_after, dry_run=bool(body.get("dry_run")))
    if not body.get("dry_run"):
        reconciler = term(request).reconciler
        reconciler.stops["operator"] = reconciler.stops.get("operator", 0) + len(outcome["stopped"])
        wake(request)
    return json_response(outcome)


async def list_routers(request: web.Request) -> web.Response:
    return json_response(items("RouterList", term(request).fleet.idle.router_rows()))


async def forget_router(request: web.Request) -> web.Response:
    router_id = request.match_info["id"]
    fleet = term(request).fleet
    try:
        router = fleet.idle.forget_router(router_id)
    except KeyError:
        raise ApiError(404, f"no router {router_id!r}", "not_found") from None
    fleet.flush_activity()
    return json_response({"id": router.id, "result": "forgotten"})


async def post_activity(request: web.Request) -> web.Response:
    fleet = term(request).fleet
    try:
        fleet.idle.report(await body_of(request))
    except ReportError as exc:
        raise ApiError(400, str(exc), "invalid_request", exc.field) from None
    # Stored before the answer (leader_only awaits it): an acknowledged goodbye survives a
    # kill -9 of the server that took it.
    fleet.flush_activity()
    term(request).stats["activity_reports"] += 1
    return json_response({"accepted": True})


# agents


HEX = frozenset("0123456789abcdef")


def proposed_credential(body) -> str | None:
    """The SHA-256 of a credential the agent made itself (`credential_sha256`), taken out of
    the body: an agent whose first answer was lost then knows its credential all the same."""
    if not isinstance(body, dict) or "credential_sha256" not in body:
        return None
    kept = body.pop("credential_sha256")
    if not (isinstance(kept, str) and len(kept) == 64 and all(c in HEX for c in kept)):
        raise ApiError(
            400,
            "credential_sha256: 64 lowercase hex digits",
            "invalid_request",
            "credential_sha256",
        )
    return kept


async def register_node(request: web.Request) -> web.Response:
    fleet = term(request).fleet
    body = await body_of(request)
    proposed = proposed_credential(body)
    caller = request.get(CALLER_KEY)
    name = body.get("name") if isinstance(body, dict) else None
    if caller is not None and "admin" not in caller.roles and caller.node != name:
        if caller.node is not None:
            raise Denied(
                403,
                f"a {caller.describe()} may not register node {name}: that needs node {name}'s"
                " own credential, the agent token or the admin token",
            )
        if isinstance(name, str) and name in fleet.credentials:
            raise ApiError(
                403,
                f"node {name} is registered with its own credential: its agent must use it"
                f" (or an admin deletes the node: gpuctl nodes delete {name})",
                "forbidden",
            )
    if proposed is not None and fleet.credentials.node_of(proposed) not in (None, name):
        raise ApiError(409, "credential_sha256: another node's credential", "conflict")
    node = fleet.register(body)
    answer = node.to_dict()
    if request.app[TOKENS_KEY] and node.name not in fleet.credentials:
        if proposed is not None:
            fleet.keep_credential(node.name, proposed)
            answer["credential_accepted"] = True
        else:
            answer["credential"] = fleet.issue_credential(node.name)
    wake(request)
    return json_response(answer, 201)


async def delete_node(request: web.Request) -> web.Response:
    node = term(request).fleet.delete_node(request.match_info["name"])
    wake(request)
    return json_response({"name": node.name, "result": "deleted"})


async def heartbeat(request: web.Request) -> web.Response:
    fleet = term(request).fleet
    assignments = fleet.heartbeat(request.match_info["name"], await body_of(request))
    if fleet.changed:
        wake(request)
    return json_response({"assignments": assignments})


async def get_assignments(request: web.Request) -> web.Response:
    fleet = term(request).fleet
    return json_response({"assignments": fleet.assignments(request.match_info["name"])})


# operators


async def view(request: web.Request, name, build):
    """A view of the fleet, shared by every reader of the same state (controlplane/views.py)."""
    return await term(request).views.get(name, build)


async def paged_list(request: web.Request, kind: str, rows: list[dict], sort_key) -> web.Response:
    try:
        chosen, metadata = page(
            rows, sort_key, request.query.get("limit"), request.query.get("continue")
        )
    except BadPage as exc:
        raise ApiError(400, str(exc), "invalid_request", exc.field) from None
    body = items(kind, chosen)
    if metadata:
        body["metadata"] = metadata
    if len(chosen) < LONG_LIST:
        return json_response(body)
    return web.Response(body=await asyncio.to_thread(orjson.dumps, body), content_type=JSON)


def by_name(row: dict) -> tuple:
    return (row["name"],)


def by_model_and_id(row: dict) -> tuple:
    return (row["model"], row["id"])


async def list_nodes(request: web.Request) -> web.Response:
    limit, token = request.query.get("limit"), request.query.get("continue")
    if not limit:
        rows = await view(request, "nodes", node_rows)
        return await paged_list(request, "NodeList", rows, by_name)
    # One page of 16,000 nodes is built alone: its rows, not the whole table's.
    try:
        body = await view(
            request, ("nodes-page", limit, token), lambda s: node_page(s, limit, token)
        )
    except BadPage as exc:
        raise ApiError(400, str(exc), "invalid_request", exc.field) from None
    return web.Response(body=body, content_type=JSON)


def node_page(snap, limit: str, token: str | None) -> bytes:
    nodes = sorted(snap.nodes, key=lambda n: n.name)
    start, end, metadata = bounds(nodes, lambda n: (n.name,), limit, token)
    body = items("NodeList", node_rows(snap, nodes[start:end]))
    if metadata:
        body["metadata"] = metadata
    return orjson.dumps(body)


async def get_node(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    term(request).fleet.node(name)
    row = next(r for r in await view(request, "nodes", node_rows) if r["name"] == name)
    return json_response(row)


async def set_node_state(request: web.Request) -> web.Response:
    action = request.match_info["action"]
    state = {
        "cordon": Schedulable.CORDONED,
        "uncordon": Schedulable.SCHEDULABLE,
        "drain": Schedulable.DRAINING,
    }.get(action)
    if state is None:
        raise ApiError(404, f"no node action {action!r} (cordon, uncordon, drain)", "not_found")
    node = term(request).fleet.set_schedulable(request.match_info["name"], state)
    wake(request)
    return json_response(node.to_dict())


async def list_models(request: web.Request) -> web.Response:
    rows = await view(request, "models", model_rows)
    return await paged_list(request, "ModelList", rows, by_name)


async def get_model(request: web.Request) -> web.Response:
    fleet = term(request).fleet
    spec = fleet.spec(request.match_info["name"])
    rows = await view(request, "models", model_rows)
    row = next(r for r in rows if r["name"] == spec.name)
    replicas = [r for r in await view(request, "replicas", replica_rows) if r["model"] == spec.name]
    events = [{"at": at, "message": text} for at, text in fleet.events.get(spec.name, ())]
    return json_response({**row, "spec": public_spec(spec), "replicas": replicas, "events": events})


async def apply_model(request: web.Request) -> web.Response:
    dry_run = request.query.get("dry_run", "") in ("1", "true")
    spec, outcome = term(request).fleet.apply(await body_of(request), dry_run=dry_run)
    if dry_run:
        explained = explain(spec, term(request).reconciler.min_residency_s)
        return json_response(
            {"spec": public_spec(spec), "result": outcome, "dry_run": True, "explain": explained}
        )
    wake(request)
    return json_response(
        {"spec": public_spec(spec), "result": outcome}, 201 if outcome == "created" else 200
    )


async def delete_model(request: web.Request) -> web.Response:
    spec = term(request).fleet.delete(request.match_info["name"])
    wake(request)
    return json_response({"spec": public_spec(spec), "result": "deleted"})


async def scale_model(request: web.Request) -> web.Response:
    body = await body_of(request)
    if not isinstance(body, dict) or "replicas" not in body:
        raise ApiError(400, "replicas: required", "invalid_request", "replicas")
    spec = term(request).fleet.scale(
        request.match_info["name"], body["replicas"], body.get("generation")
    )
    wake(request)
    return json_response({"spec": public_spec(spec), "result": "scaled"})


async def list_replicas(request: web.Request) -> web.Response:
    rows = await view(request, "replicas", replica_rows)
    model = request.query.get("model")
    if model:
        rows = [r for r in rows if r["model"] == model]
    return await paged_list(request, "ReplicaList", rows, by_model_and_id)


async def get_summary(request: web.Request) -> web.Response:
    idle_after = request.query.get("idle_after")
    try:
        threshold = parse_duration(idle_after, "idle_after") if idle_after else None
    except SpecError as exc:
        raise ApiError(400, str(exc), "invalid_request", "idle_after") from None
    body = await view(
        request, ("summary.json", threshold), lambda s: orjson.dumps(summary(s, threshold))
    )
    return web.Response(body=body, content_type=JSON)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def get_leader(request: web.Request) -> web.Response:
    """200 on the leader, 503 on a standby: what a load balancer's health check asks."""
    about = request.app[LEADERSHIP_KEY].describe()
    return json_response(about, 200 if about["leader"] else 503)


async def metrics(request: web.Request) -> web.Response:
    if term(request) is None:
        return web.Response(text=LEADER_FAMILY.format(0), content_type="text/plain")
    fleet = term(request).fleet
    stats = {
        **term(request).stats,
        "stops": dict(term(request).reconciler.stops),
        "swap_totals": dict(fleet.swap_totals),
        "swap_seconds": fleet.swap_seconds.copy(),
        "sleep_totals": dict(fleet.sleep_totals),
        "wake_totals": dict(fleet.wake_totals),
        "wake_seconds": fleet.wake_seconds.copy(),
        "adapter_loads": dict(fleet.adapter_loads),
        "adapter_unloads": dict(fleet.adapter_unloads),
        "views_built": term(request).views.built,
    }
    fleet_summary = await view(request, ("summary", None), lambda s: summary(s))
    models = await view(request, "models", model_rows)
    stats["adapters"] = await view(request, "adapters", adapter_rows)
    text = await asyncio.to_thread(exposition, fleet_summary, models, stats)
    return web.Response(text=LEADER_FAMILY.format(1) + text, content_type="text/plain")


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
    ("GET", "/v1/replicas", list_replicas, READ),
    ("GET", "/v1/summary", get_summary, READ),
]


def build_app(
    leadership, tokens: dict[str, str], metrics_token: str | None = None
) -> web.Application:
    """`leadership`: a Sole or an Elected (controlplane/leadership.py), whose term the API
    acts on."""
    tokens = dict(tokens)
    app = web.Application(
        middlewares=[errors, leader_only, authorization], client_max_size=16 * 1024 * 1024
    )
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

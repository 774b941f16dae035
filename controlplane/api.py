"""The control plane's HTTP API (aiohttp), versioned under /v1/. Reference: docs/api.md."""

from __future__ import annotations

import hmac

import orjson
from aiohttp import web

from controlplane.explain import explain
from controlplane.fleet import BadRequest, Conflict, Fleet, NotFound
from controlplane.idle import ReportError
from controlplane.metrics import exposition
from controlplane.model import ReplicaState, Schedulable, SpecError, parse_duration
from controlplane.reconciler import Reconciler
from controlplane.scaling import plan_stop_idle
from controlplane.summary import model_rows, node_rows, replica_rows, summary

FLEET_KEY = web.AppKey("fleet", Fleet)
RECONCILER_KEY = web.AppKey("reconciler", Reconciler)
TOKENS_KEY = web.AppKey("tokens", dict)
WAKE_KEY = web.AppKey("wake", object)
STATS_KEY = web.AppKey("stats", dict)


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.field = status, message, kind, field


def json_response(payload, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


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


def require(request: web.Request, *roles: str) -> None:
    """401 unless the bearer token is one of `roles`' tokens (admin may do anything)."""
    tokens = request.app[TOKENS_KEY]
    if not tokens:
        return
    given = request.headers.get("Authorization", "")
    if given.startswith("Bearer "):
        token = given[7:].strip().encode()
        for role in (*roles, "admin"):
            expected = tokens.get(role)
            if expected and hmac.compare_digest(token, expected.encode()):
                return
    raise ApiError(401, f"this call needs the {' or '.join(roles)} token", "unauthorized")


async def body_of(request: web.Request):
    raw = await request.read()
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", "invalid_request") from None


def items(kind: str, rows: list) -> dict:
    return {"kind": kind, "apiVersion": "v1", "items": rows}


def wake(request: web.Request) -> None:
    request.app[WAKE_KEY].set()


# routers


async def get_routes(request: web.Request) -> web.Response:
    require(request, "router")
    try:
        after = int(request.query.get("after", "-1"))
        wait = min(float(request.query.get("wait", "0")), 60.0)
    except ValueError:
        raise ApiError(
            400, "after must be an integer and wait a number of seconds", "invalid_request", "after"
        ) from None
    table = request.app[RECONCILER_KEY].routes
    return json_response(await table.wait_for_change(after, wait))


async def post_demand(request: web.Request) -> web.Response:
    """A router holds requests for a model with no ready replica: wake it if it sleeps, and
    say at once when it cannot be placed (the router then answers its requests with why)."""
    require(request, "router")
    body = await body_of(request)
    model, waiting = body.get("model") if isinstance(body, dict) else None, body.get("waiting", 1)
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model: required, a string", "invalid_request", "model")
    if isinstance(waiting, bool) or not isinstance(waiting, int) or waiting < 0:
        raise ApiError(400, "waiting: a non-negative integer", "invalid_request", "waiting")
    fleet = request.app[FLEET_KEY]
    spec = fleet.demand(model, waiting)

    def ready() -> int:
        return sum(
            1 for r in fleet.replicas.values() if r.model == model and r.state == ReplicaState.READY
        )

    if fleet.changed or not ready():
        # Place it, or make room for it, now: the answer carries the outcome.
        request.app[RECONCILER_KEY].tick()
        request.app[STATS_KEY]["ticks"] += 1
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


async def stop_idle(request: web.Request) -> web.Response:
    """`gpuctl stop-idle`: the scale-down rules, once, on an operator's word."""
    require(request, "admin")
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
    fleet = request.app[FLEET_KEY]
    for name in models:
        fleet.spec(name)  # 404 for a model that does not exist
    outcome = plan_stop_idle(fleet, models, idle_after, dry_run=bool(body.get("dry_run")))
    if not body.get("dry_run"):
        reconciler = request.app[RECONCILER_KEY]
        reconciler.stops["operator"] = reconciler.stops.get("operator", 0) + len(outcome["stopped"])
        wake(request)
    return json_response(outcome)


async def list_routers(request: web.Request) -> web.Response:
    return json_response(items("RouterList", request.app[FLEET_KEY].idle.router_rows()))


async def forget_router(request: web.Request) -> web.Response:
    require(request, "admin")
    router_id = request.match_info["id"]
    fleet = request.app[FLEET_KEY]
    try:
        router = fleet.idle.forget_router(router_id)
    except KeyError:
        raise ApiError(404, f"no router {router_id!r}", "not_found") from None
    fleet.flush_activity()
    return json_response({"id": router.id, "result": "forgotten"})


async def post_activity(request: web.Request) -> web.Response:
    require(request, "router")
    try:
        request.app[FLEET_KEY].idle.report(await body_of(request))
    except ReportError as exc:
        raise ApiError(400, str(exc), "invalid_request", exc.field) from None
    request.app[STATS_KEY]["activity_reports"] += 1
    return json_response({"accepted": True})


# agents


async def register_node(request: web.Request) -> web.Response:
    require(request, "agent")
    node = request.app[FLEET_KEY].register(await body_of(request))
    wake(request)
    return json_response(node.to_dict(), 201)


async def heartbeat(request: web.Request) -> web.Response:
    require(request, "agent")
    fleet = request.app[FLEET_KEY]
    assignments = fleet.heartbeat(request.match_info["name"], await body_of(request))
    if fleet.changed:
        wake(request)
    return json_response({"assignments": assignments})


async def get_assignments(request: web.Request) -> web.Response:
    require(request, "agent")
    fleet = request.app[FLEET_KEY]
    return json_response({"assignments": fleet.assignments(request.match_info["name"])})


# operators


def snapshot(request: web.Request):
    return request.app[FLEET_KEY].snapshot(request.app[RECONCILER_KEY].routes.version)


async def list_nodes(request: web.Request) -> web.Response:
    return json_response(items("NodeList", node_rows(snapshot(request))))


async def get_node(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    request.app[FLEET_KEY].node(name)
    row = next(r for r in node_rows(snapshot(request)) if r["name"] == name)
    return json_response(row)


async def set_node_state(request: web.Request) -> web.Response:
    require(request, "admin")
    action = request.match_info["action"]
    state = {
        "cordon": Schedulable.CORDONED,
        "uncordon": Schedulable.SCHEDULABLE,
        "drain": Schedulable.DRAINING,
    }.get(action)
    if state is None:
        raise ApiError(404, f"no node action {action!r} (cordon, uncordon, drain)", "not_found")
    node = request.app[FLEET_KEY].set_schedulable(request.match_info["name"], state)
    wake(request)
    return json_response(node.to_dict())


async def list_models(request: web.Request) -> web.Response:
    return json_response(items("ModelList", model_rows(snapshot(request))))


async def get_model(request: web.Request) -> web.Response:
    fleet = request.app[FLEET_KEY]
    spec = fleet.spec(request.match_info["name"])
    snap = snapshot(request)
    row = next(r for r in model_rows(snap) if r["name"] == spec.name)
    replicas = [r for r in replica_rows(snap) if r["model"] == spec.name]
    events = [{"at": at, "message": text} for at, text in fleet.events.get(spec.name, ())]
    return json_response({**row, "spec": spec.to_dict(), "replicas": replicas, "events": events})


async def apply_model(request: web.Request) -> web.Response:
    require(request, "admin")
    dry_run = request.query.get("dry_run", "") in ("1", "true")
    spec, outcome = request.app[FLEET_KEY].apply(await body_of(request), dry_run=dry_run)
    if dry_run:
        explained = explain(spec, request.app[RECONCILER_KEY].min_residency_s)
        return json_response(
            {"spec": spec.to_dict(), "result": outcome, "dry_run": True, "explain": explained}
        )
    wake(request)
    return json_response(
        {"spec": spec.to_dict(), "result": outcome}, 201 if outcome == "created" else 200
    )


async def delete_model(request: web.Request) -> web.Response:
    require(request, "admin")
    spec = request.app[FLEET_KEY].delete(request.match_info["name"])
    wake(request)
    return json_response({"spec": spec.to_dict(), "result": "deleted"})


async def scale_model(request: web.Request) -> web.Response:
    require(request, "admin")
    body = await body_of(request)
    if not isinstance(body, dict) or "replicas" not in body:
        raise ApiError(400, "replicas: required", "invalid_request", "replicas")
    spec = request.app[FLEET_KEY].scale(
        request.match_info["name"], body["replicas"], body.get("generation")
    )
    wake(request)
    return json_response({"spec": spec.to_dict(), "result": "scaled"})


async def list_replicas(request: web.Request) -> web.Response:
    rows = replica_rows(snapshot(request))
    model = request.query.get("model")
    if model:
        rows = [r for r in rows if r["model"] == model]
    return json_response(items("ReplicaList", rows))


async def get_summary(request: web.Request) -> web.Response:
    idle_after = request.query.get("idle_after")
    try:
        threshold = parse_duration(idle_after, "idle_after") if idle_after else None
    except SpecError as exc:
        raise ApiError(400, str(exc), "invalid_request", "idle_after") from None
    return json_response(summary(snapshot(request), threshold))


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    snap = snapshot(request)
    fleet = request.app[FLEET_KEY]
    stats = {
        **request.app[STATS_KEY],
        "stops": request.app[RECONCILER_KEY].stops,
        "swap_totals": fleet.swap_totals,
        "swap_seconds": fleet.swap_seconds,
    }
    text = exposition(summary(snap), model_rows(snap), stats)
    return web.Response(text=text, content_type="text/plain")


def build_app(
    fleet: Fleet, reconciler: Reconciler, tokens: dict[str, str], wake_event
) -> web.Application:
    app = web.Application(middlewares=[errors], client_max_size=16 * 1024 * 1024)
    app[FLEET_KEY] = fleet
    app[RECONCILER_KEY] = reconciler
    app[TOKENS_KEY] = tokens
    app[WAKE_KEY] = wake_event
    app[STATS_KEY] = {"activity_reports": 0, "ticks": 0}
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/metrics", metrics)
    r.add_get("/v1/routes", get_routes)
    r.add_post("/v1/activity", post_activity)
    r.add_post("/v1/demand", post_demand)
    r.add_post("/v1/stop-idle", stop_idle)
    r.add_get("/v1/routers", list_routers)
    r.add_delete("/v1/routers/{id}", forget_router)
    r.add_post("/v1/nodes", register_node)
    r.add_get("/v1/nodes", list_nodes)
    r.add_get("/v1/nodes/{name}", get_node)
    r.add_post("/v1/nodes/{name}/heartbeat", heartbeat)
    r.add_get("/v1/nodes/{name}/assignments", get_assignments)
    r.add_post("/v1/nodes/{name}/{action}", set_node_state)
    r.add_get("/v1/models", list_models)
    r.add_post("/v1/models", apply_model)
    r.add_get("/v1/models/{name}", get_model)
    r.add_delete("/v1/models/{name}", delete_model)
    r.add_post("/v1/models/{name}/scale", scale_model)
    r.add_get("/v1/replicas", list_replicas)
    r.add_get("/v1/summary", get_summary)
    return app

"""The operators' side of the API: nodes, models, adapters, replicas, the summary, metrics."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from controlplane.api.metrics import exposition
from controlplane.api.paging import BadPage, bounds
from controlplane.api.plumbing import (
    JSON,
    LEADERSHIP_KEY,
    ApiError,
    applied,
    body_of,
    items,
    json_response,
    paged_list,
    term,
    view,
    wake,
)
from controlplane.rules.scaling import stop_idle as stop_idle_now
from controlplane.views.explain import explain
from controlplane.views.summary import adapter_rows, model_rows, node_rows, replica_rows, summary
from controlplane.vocabulary.model import Schedulable
from controlplane.vocabulary.redact import public_spec
from controlplane.vocabulary.specs import SpecError, parse_duration

LEADER_FAMILY = (
    "# HELP gpufleet_leader Whether this server leads (1) or stands by (0).\n"
    "# TYPE gpufleet_leader gauge\ngpufleet_leader {}\n"
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
    return await applied(request, "adapter", term(request).fleet.apply_adapter)


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
    dry_run = bool(body.get("dry_run"))
    executor = term(request).reconciler.executor
    outcome = stop_idle_now(fleet, executor, models, idle_after, dry_run)
    if not dry_run:
        wake(request)
    return json_response(outcome)


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
        "adapter_resolved": dict(fleet.adapter_resolved),
        "adapter_unloads": dict(fleet.adapter_unloads),
        "views_built": term(request).views.built,
        "gpu_seconds_last_hour": await fleet.allocations.charged(
            fleet.meter, fleet.ledger.minutes, fleet.adapter_bases(), 3600.0, fleet.wall()
        ),
    }
    fleet_summary = await view(request, ("summary", None), lambda s: summary(s))
    models = await view(request, "models", model_rows)
    stats["adapters"] = await view(request, "adapters", adapter_rows)
    text = await asyncio.to_thread(exposition, fleet_summary, models, stats)
    return web.Response(text=LEADER_FAMILY.format(1) + text, content_type="text/plain")

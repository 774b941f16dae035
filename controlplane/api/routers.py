"""The routers' side of the API: route tables, demand for models and adapters, activity."""

from __future__ import annotations

from aiohttp import web

from controlplane.api.plumbing import ApiError, body_of, items, json_response, term
from controlplane.vocabulary.idle import ReportError
from controlplane.vocabulary.model import ReplicaState

# How long a demand waits for the tick that places its model before it answers as things are.
DEMAND_WAIT_S = 5.0
# Prompt reports that come within this long of each other are taken by one tick.
PROMPT_WAKE_S = 0.2


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
    fleet.demand(model, waiting)
    fleet.flush_records()  # stored before the answer, as every change is
    tracing = term(request).reconciler.tracing
    # The trace of what is done for this model, begun before the tick that acts on it; the
    # router's parked requests name it.
    trace_ids = (
        ("", "")
        if tracing is None
        else tracing.demand(model, request.headers.get("traceparent"), fleet.ready_count(model) > 0)
    )
    if fleet.changed or not fleet.ready_count(model):
        # Placed, or room made for it, by the next tick (paced as every tick is): the answer
        # carries the outcome.
        await term(request).after_next_tick(DEMAND_WAIT_S)
    answer = fleet.demand_answer(model)
    if tracing is not None:
        answer["trace_id"], answer["span_id"] = trace_ids
    return json_response(answer)


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
    body = await body_of(request)
    try:
        tenants = fleet.ledger.check(body)  # before anything is taken from the report
        fleet.idle.report(body)
        fleet.ledger.report(body, tenants, fleet.wall())
        fleet.take_resolve_failures(body.get("adapter_failures"))
    except ReportError as exc:
        raise ApiError(400, str(exc), "invalid_request", exc.field) from None
    # Stored before the answer (leader_only awaits it): an acknowledged goodbye survives a
    # kill -9 of the server that took it.
    fleet.flush_activity()
    term(request).stats["activity_reports"] += 1
    if body.get("prompt"):
        # Sent at once, not on the router's tick: an acknowledgement a replica on its way out
        # may be waiting for, or a share requests wait for, taken by a tick within moments.
        term(request).wake_soon(PROMPT_WAKE_S)
    return json_response({"accepted": True})

"""Tenants in the API: apply, list, delete; keys made (shown once) and revoked; usage."""

from __future__ import annotations

from aiohttp import web

from controlplane.api.plumbing import ApiError, applied, items, json_response, term, wake
from controlplane.rules.cost import UNALLOCATED, with_cost
from controlplane.vocabulary.specs import SpecError, parse_duration

USAGE_SINCE_MOST_S = 24 * 3600.0  # what the ledger keeps


async def list_tenants(request: web.Request) -> web.Response:
    return json_response(items("TenantList", term(request).fleet.tenant_rows()))


async def get_tenant(request: web.Request) -> web.Response:
    fleet = term(request).fleet
    name = fleet.tenant(request.match_info["name"]).name
    return json_response(next(r for r in fleet.tenant_rows() if r["name"] == name))


async def apply_tenant(request: web.Request) -> web.Response:
    return await applied(request, "tenant", term(request).fleet.apply_tenant)


async def delete_tenant(request: web.Request) -> web.Response:
    tenant = term(request).fleet.delete_tenant(request.match_info["name"])
    wake(request)
    return json_response({"tenant": tenant.to_dict(), "result": "deleted"})


async def create_key(request: web.Request) -> web.Response:
    key, kept = term(request).fleet.create_key(request.match_info["name"])
    wake(request)
    return json_response({**kept.row(), "key": key, "result": "created"}, 201)


async def revoke_key(request: web.Request) -> web.Response:
    kept = term(request).fleet.revoke_key(request.match_info["id"])
    wake(request)
    return json_response({**kept.row(), "result": "revoked"})


async def get_usage(request: web.Request) -> web.Response:
    """Per tenant and model over `?since=` (a duration, 1h by default, at most 24h)."""
    try:
        since = parse_duration(request.query.get("since", "1h"), "since")
    except SpecError as exc:
        raise ApiError(400, str(exc), "invalid_request", "since") from None
    if since > USAGE_SINCE_MOST_S:
        raise ApiError(400, "since: at most 24h is kept", "invalid_request", "since")
    fleet = term(request).fleet
    now = fleet.wall()
    charged = await fleet.allocations.charged(
        fleet.meter, fleet.ledger.minutes, fleet.adapter_bases(), since, now
    )
    rows = with_cost(fleet.ledger.usage(since, now), charged)
    tenant = request.query.get("tenant")
    if tenant:
        rows = [r for r in rows if r["tenant"] == tenant]
    body = items("UsageList", rows)
    body["since_s"] = since
    body["fleet_gpu_seconds"] = round(fleet.meter.fleet_gpu_seconds(since, now), 1)
    body["allocated_gpu_seconds"] = round(sum(c[0] for c in charged.values()), 1)
    body["unallocated_gpu_seconds"] = round(
        sum(c[0] for (t, _), c in charged.items() if t == UNALLOCATED), 1
    )
    return json_response(body)

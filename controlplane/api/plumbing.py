"""The API's plumbing: its keys, errors, middlewares and answers, shared by every handler."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from controlplane.api.paging import BadPage, page
from controlplane.state.fleet import BadRequest, Conflict, NotFound
from controlplane.state.store import OutcomeUnknown, StoreUnavailable
from controlplane.tick.leadership import Term
from controlplane.vocabulary.auth import NO_CREDENTIALS, Denied, check, identify
from controlplane.vocabulary.specs import SpecError

TOKENS_KEY = web.AppKey("tokens", dict)
METRICS_TOKEN_KEY = web.AppKey("metrics_token", str)
NEEDS_KEY = web.AppKey("needs", dict)  # route -> the roles that may call it
METRICS_ROUTE_KEY = web.AppKey("metrics_route", object)
LEADERSHIP_KEY = web.AppKey("leadership", object)
CALLER_KEY = web.RequestKey("caller", object)
TERM_KEY = web.RequestKey("term", object)
# Answered by every server, leader or standby: for load balancers, probes and scrapers.
LOCAL_PATHS = {"/healthz", "/v1/leader", "/metrics"}
RETRY_AFTER_S = "1"
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
    current = request[TERM_KEY]
    if route is request.app[METRICS_ROUTE_KEY]:
        if request.app[METRICS_TOKEN_KEY]:
            tokens = {**tokens, "metrics": request.app[METRICS_TOKEN_KEY]}
        if current is not None and current.fleet.auth_mode == "tenants":
            # It names tenants and what they spend: closed as the routers' /metrics is.
            if not tokens:
                raise Denied(
                    401,
                    "this fleet has tenants, whose usage /metrics shows: it needs a token"
                    " (gpuctl server --metrics-token, or a viewer's from --token-file)",
                )
            needs = ("metrics", "viewer")
    if not tokens or needs is None:  # open, or no such route (404/405 follow)
        return await handler(request)
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


async def view(request: web.Request, name, build):
    """A view of the fleet, shared by every reader of the same state (views/cache.py)."""
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


async def applied(request: web.Request, kind: str, apply) -> web.Response:
    """POST of an object applied whole (`?dry_run=true` checks it only): `apply(body,
    dry_run)` gives the object and created, updated or unchanged."""
    dry_run = request.query.get("dry_run", "") in ("1", "true")
    found, outcome = apply(await body_of(request), dry_run)
    if not dry_run:
        wake(request)
    answer = {kind: found.to_dict(), "result": outcome}
    if dry_run:
        answer["dry_run"] = True
    return json_response(answer, 201 if outcome == "created" and not dry_run else 200)

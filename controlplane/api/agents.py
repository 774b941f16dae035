"""The agents' side of the API: registration, heartbeats and assignments."""

from __future__ import annotations

import asyncio
import math

from aiohttp import web

from controlplane.api.plumbing import (
    CALLER_KEY,
    LEADERSHIP_KEY,
    TOKENS_KEY,
    ApiError,
    body_of,
    json_response,
    term,
    unavailable,
    wake,
)
from controlplane.state.orders import MAX_WAIT_S, digest
from controlplane.vocabulary.auth import Denied

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
    current = term(request)
    fleet, name = current.fleet, request.match_info["name"]
    assignments = fleet.heartbeat(name, await body_of(request))
    if fleet.changed:
        wake(request)
    # The period is handed out here, and remembered, so the node's timeout is judged on it.
    period = current.reconciler.settings.pacing.period(len(fleet.nodes))
    fleet.nodes[name].heartbeat_s = period
    return json_response({**orders_answer(fleet, assignments), "heartbeat_s": period})


def orders_answer(fleet, assignments: list[dict]) -> dict:
    return {
        "assignments": assignments,
        "orders": fleet.orders.version,
        "digest": digest(assignments),
    }


async def get_assignments(request: web.Request) -> web.Response:
    """A node's assignments; with `digest` (of the assignments its agent holds), a watch: the
    answer waits up to `wait` seconds for them to differ (controlplane/state/orders.py)."""
    current = term(request)
    fleet, name = current.fleet, request.match_info["name"]
    held = request.query.get("digest")
    try:
        wait = float(request.query.get("wait", "0"))
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= MAX_WAIT_S:
        raise ApiError(
            400, f"wait: a number of seconds from 0 to {MAX_WAIT_S:g}", "invalid_request", "wait"
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    assignments = fleet.assignments(name)
    while held is not None and digest(assignments) == held:
        left = deadline - loop.time()
        if left <= 0 or not await fleet.orders.changed(name, left):
            break
        if request.app[LEADERSHIP_KEY].term is not current:
            return unavailable("this server no longer leads: watch the leader")
        assignments = fleet.assignments(name)
    return json_response(orders_answer(fleet, assignments))

"""Fault injection for a simulated fleet, over HTTP on loopback: `gpuctl sim ...` calls it."""

from __future__ import annotations

import orjson
from aiohttp import web

AGENTS_KEY = web.AppKey("agents", dict)


def _json(payload, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json(
        {"error": {"message": message, "type": "invalid_request", "param": None, "code": status}},
        status,
    )


async def _body(request: web.Request):
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def build_admin(agents: dict) -> web.Application:
    """`agents`: node name -> NodeAgent whose inventory is a SimInventory."""
    app = web.Application()
    app[AGENTS_KEY] = agents

    async def nodes(request):
        return _json(
            {
                "items": [
                    {
                        "name": name,
                        "silenced": agent.silenced,
                        "faults": {str(i): r for i, r in agent.inventory.faults.items()},
                        "replicas": sorted(agent.supervisor.running),
                    }
                    for name, agent in sorted(agents.items())
                ]
            }
        )

    async def node_request(request, shape: str):
        """(agent, body) of a call about one node, or the error response to send."""
        body = await _body(request)
        if body is None:
            return None, _error(400, f"expected a JSON object {shape}")
        agent = agents.get(body.get("node"))
        if agent is None:
            return None, _error(404, f"no simulated node {body.get('node')!r}")
        return agent, body

    async def gpu_fault(request):
        agent, body = await node_request(request, "{node, index, reason}")
        if agent is None:
            return body
        index = body.get("index")
        if not isinstance(index, int) or not 0 <= index < agent.inventory.gpu_count:
            return _error(400, f"index: node {agent.inventory.name} has no GPU {index!r}")
        if request.match_info["action"] == "fail":
            agent.inventory.faults[index] = str(body.get("reason") or "simulated fault")
        else:
            agent.inventory.faults.pop(index, None)
        faults = {str(i): reason for i, reason in agent.inventory.faults.items()}
        return _json({"node": agent.inventory.name, "faults": faults})

    async def silence(request):
        agent, body = await node_request(request, "{node, silent}")
        if agent is None:
            return body
        agent.silenced = bool(body.get("silent", True))
        return _json({"node": agent.inventory.name, "silenced": agent.silenced})

    async def kill(request):
        body = await _body(request)
        if body is None or not isinstance(body.get("replica"), str):
            return _error(400, "expected a JSON object {replica}")
        for agent in agents.values():
            if agent.supervisor.kill(body["replica"]):
                return _json({"killed": body["replica"], "node": agent.inventory.name})
        return _error(404, f"no replica {body['replica']!r} runs on this simulated fleet")

    async def memory(request):
        """An engine that takes more (or less) of its card than it was told."""
        body = await _body(request)
        mb = body.get("mb") if body is not None else None
        if body is None or not isinstance(body.get("replica"), str):
            return _error(400, "expected a JSON object {replica, mb}")
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 0:
            return _error(400, f"mb: MiB, a whole number >= 0, got {mb!r}")
        for agent in agents.values():
            if body["replica"] in agent.supervisor.running:
                agent.inventory.memory_taken[body["replica"]] = mb
                return _json({"replica": body["replica"], "mb": mb, "node": agent.inventory.name})
        return _error(404, f"no replica {body['replica']!r} runs on this simulated fleet")

    async def cards(request):
        """What each simulated card granted its engines, and every allocation it refused."""
        return _json(
            {
                "items": [
                    {
                        "name": name,
                        "memory_mb": agent.inventory.memory_mb,
                        "held": dict(sorted(agent.inventory.claims.items())),
                        "refusals": list(agent.inventory.refusals),
                    }
                    for name, agent in sorted(agents.items())
                ]
            }
        )

    app.router.add_get("/nodes", nodes)
    app.router.add_get("/cards", cards)
    app.router.add_post("/memory", memory)
    app.router.add_post("/gpu/{action:fail|heal}", gpu_fault)
    app.router.add_post("/silence", silence)
    app.router.add_post("/kill", kill)
    return app

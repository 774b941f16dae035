"""The ActivitySink client: once a tick, the table's snapshot goes to the control plane."""

from __future__ import annotations

import logging
import time

import aiohttp
import orjson

from router.control.leader import CALL_TIMEOUT_S

log = logging.getLogger("gpurouter.activity")


def activity_report(
    router_id: str,
    incarnation: str,
    started: float,
    table,
    waiting: dict | None = None,
    engine_load: dict | None = None,
) -> dict:
    """DESIGN.md's report: who reports (identity and incarnation), its uptime, the route
    version it holds, the snapshot's `used`, `watched` and per-replica `in_flight` maps (removed
    replicas still carrying requests too), the requests sent to each replica since it was
    watched (`requests`: a counter), the requests it holds per model, `waiting`, and
    what it last read of the engines' own load, `engine_load` (replica -> [waiting, running,
    KV use, seconds since read])."""
    snapshot = table.snapshot()
    return {
        "engine_load": engine_load or {},
        "router": router_id,
        "incarnation": incarnation,
        "uptime_s": time.monotonic() - started,
        "route_version": table.version,
        "used": snapshot["used"],
        "watched": snapshot["watched"],
        "in_flight": snapshot["in_flight"],
        "requests": snapshot["requests"],
        "waiting": waiting or {},
    }


class ActivityReporter:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        control_planes,
        router_id: str,
        incarnation: str,
        table,
        token: str | None,
        started: float,
        engine_load=None,
        tenants=None,
        resolvers=None,
    ) -> None:
        self.session = session
        self.control_planes = control_planes  # router/control/leader.py
        self.router_id = router_id
        self.incarnation = incarnation
        self.table = table
        self.started = started
        self.engine_load = engine_load  # () -> the reader's readings, or None
        self.tenants = tenants  # router/tenancy/tenants.py's TenantBook, or None
        self.resolvers = resolvers  # router/control/resolvers.py's Resolvers, or None
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.failures = 0

    async def report(
        self, waiting: dict | None = None, goodbye: bool = False, prompt: bool = False
    ) -> bool:
        """Post one report; `goodbye` marks the last one of a clean shutdown, `prompt` one sent
        between ticks, that a replica on its way out may be waiting for (router/control/acks.py)."""
        report = activity_report(
            self.router_id,
            self.incarnation,
            self.started,
            self.table,
            waiting,
            self.engine_load() if self.engine_load else None,
        )
        if self.tenants is not None and self.tenants.tenants:
            report["tenants"] = self.tenants.report()
            report["keys_used"] = self.tenants.take_keys_used()
        failed = dict(self.resolvers.failures) if self.resolvers is not None else {}
        if failed:
            report["adapter_failures"] = failed  # REPLICA@ADAPTER a resolver could not load
        if goodbye:
            report["goodbye"] = True
        if prompt:
            report["prompt"] = True
        body = orjson.dumps(report)
        base = self.control_planes.url
        try:
            timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
            async with self.session.post(
                base + "/v1/activity",
                data=body,
                headers=self.headers,
                timeout=timeout,
            ) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                self.control_planes.answered(resp)
            self.failures = 0
            if failed:
                self.resolvers.reported(failed)
            return True
        except Exception as exc:  # reports are best effort; the next tick tries again
            self.control_planes.failed(base)
            self.failures += 1
            if self.failures in (1, 10) or self.failures % 100 == 0:
                log.warning("activity report failed %d time(s): %s", self.failures, exc)
            return False

    async def demand(
        self, model: str, waiting: int, traceparent: str | None = None
    ) -> tuple[str, bool, tuple[str, str]]:
        """Tell the control plane at once that requests wait for `model`. Returns why it
        cannot be placed ("" when it can, or when the control plane could not be asked),
        whether that is final (no room can be made for it: answer its requests now), and the
        ids of the control plane's trace of what it does for the model and of that trace's
        `demand` span (empty when it traces nothing). `traceparent`: a waiting request's span,
        which that trace continues."""
        base = self.control_planes.url
        url = base + "/v1/demand"
        headers = self.headers
        if traceparent is not None:
            headers = {**headers, "traceparent": traceparent}
        try:
            timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
            body = orjson.dumps({"model": model, "waiting": waiting})
            async with self.session.post(url, data=body, headers=headers, timeout=timeout) as resp:
                answer = await resp.json(content_type=None)
                if resp.status >= 300:
                    raise RuntimeError(f"HTTP {resp.status}: {answer}")
                self.control_planes.answered(resp)
            trace = (str(answer.get("trace_id") or ""), str(answer.get("span_id") or ""))
            if answer.get("ready"):
                return "", False, trace
            # A control plane that does not say whether is one that makes no room: final.
            return str(answer.get("reason") or ""), bool(answer.get("final", True)), trace
        except Exception as exc:  # the parked requests wait on; the next demand tries again
            self.control_planes.failed(base)
            log.warning("demand for %s not heard: %s", model, exc)
            return "", False, ("", "")

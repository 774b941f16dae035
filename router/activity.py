"""The ActivitySink client: once a tick, the table's snapshot goes to the control plane."""

from __future__ import annotations

import logging
import time

import aiohttp
import orjson

log = logging.getLogger("gpurouter.activity")


def activity_report(router_id: str, started: float, table) -> dict:
    """DESIGN.md's report: router, uptime and the snapshot's `used` and `watched` maps."""
    snapshot = table.snapshot()
    return {
        "router": router_id,
        "uptime_s": time.monotonic() - started,
        "used": snapshot["used"],
        "watched": snapshot["watched"],
    }


class ActivityReporter:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        router_id: str,
        table,
        token: str | None,
        started: float,
    ) -> None:
        self.session = session
        self.url = base_url.rstrip("/") + "/v1/activity"
        self.router_id = router_id
        self.table = table
        self.started = started
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.failures = 0

    async def report(self) -> bool:
        body = orjson.dumps(activity_report(self.router_id, self.started, self.table))
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with self.session.post(
                self.url, data=body, headers=self.headers, timeout=timeout
            ) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            self.failures = 0
            return True
        except Exception as exc:  # reports are best effort; the next tick tries again
            self.failures += 1
            if self.failures in (1, 10) or self.failures % 100 == 0:
                log.warning("activity report failed %d time(s): %s", self.failures, exc)
            return False

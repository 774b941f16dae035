"""A watch on the event loop itself: a warning when it was held, since everything else on it
(heartbeats first) waited that long."""

from __future__ import annotations

import asyncio
import logging
import time

LOOP_CHECK_S = 0.5
LOOP_LATE_S = 1.0


async def watch_loop_lag(log: logging.Logger) -> None:
    while True:
        due = time.perf_counter() + LOOP_CHECK_S
        await asyncio.sleep(LOOP_CHECK_S)
        late = time.perf_counter() - due
        if late > LOOP_LATE_S:
            log.warning("the event loop was held for %.1f s", late)

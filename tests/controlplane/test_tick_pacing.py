"""The reconcile loop leaves the event loop to heartbeats between ticks, however often it is
woken: after a tick that took T, it yields the loop for T before the next."""

import asyncio
import time
from types import SimpleNamespace

from controlplane import server


class BusyReconciler:
    """A reconciler whose every tick holds the loop for `busy_s`, as one over a large fleet."""

    class _Idle:
        def forget_gone(self):
            pass

    def __init__(self, busy_s: float) -> None:
        self.busy_s = busy_s
        self.fleet = type("F", (), {"idle": self._Idle()})()
        self.ticks = 0
        self.log: list[tuple[str, float]] = []

    def tick(self) -> None:
        self.ticks += 1
        self.log.append(("tick", self.busy_s))
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            pass


def test_long_ticks_woken_back_to_back_each_leave_the_loop_as_long_as_they_took(monkeypatch):
    reconciler = BusyReconciler(busy_s=server.PACED_TICK_S + 0.02)
    wake = asyncio.Event()
    real_sleep = asyncio.sleep

    async def sleep(seconds, *args):
        reconciler.log.append(("yield", seconds))
        await real_sleep(seconds, *args)

    async def main():
        monkeypatch.setattr(server.asyncio, "sleep", sleep)
        term = SimpleNamespace(
            reconciler=reconciler, wake=wake, stats={"ticks": 0}, tick_waiters=[]
        )
        ticker = asyncio.create_task(server.tick_loop(term, 1.0))
        while reconciler.ticks < 4:
            wake.set()  # every heartbeat changes something, and wakes the reconciler
            await real_sleep(0.001)
        ticker.cancel()

    asyncio.run(main())
    ticks = [i for i, (what, _) in enumerate(reconciler.log) if what == "tick"]
    for before, after in zip(ticks, ticks[1:], strict=False):
        between = [s for what, s in reconciler.log[before + 1 : after] if what == "yield"]
        assert between and max(between) >= reconciler.busy_s, reconciler.log

"""A tick that fails mid-way has its writes rolled back; the memory it changed must not stay
served apart from the store. The server loads its state again from the store."""

import asyncio
import urllib.request

import orjson

from controlplane import server
from controlplane.tick.reconciler import Reconciler
from tests.controlplane.conftest import spec
from tests.harness import free_port


def test_after_a_failed_tick_the_server_serves_what_is_stored(tmp_path, monkeypatch):
    real_tick = Reconciler.tick
    failures = []

    def failing_tick(self):
        fleet = self.fleet
        if "ghost" not in fleet.specs and not failures and len(fleet.specs) == 1:
            with fleet.store.batch():
                fleet.apply(spec(name="ghost"))  # in memory, and in the tick's batch
                failures.append("ghost")
                raise RuntimeError("a bug half-way through a tick")
        real_tick(self)

    monkeypatch.setattr(Reconciler, "tick", failing_tick)
    port = free_port()
    settings = server.Settings("127.0.0.1", port, str(tmp_path / "state.sqlite"), {}, tick_s=0.2)

    def models() -> list[str]:
        url = f"http://127.0.0.1:{port}/v1/models"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return [m["name"] for m in orjson.loads(answer.read())["items"]]

    async def main():
        stop = asyncio.Event()
        serving = asyncio.create_task(server.serve_sole(settings, stop))
        await asyncio.sleep(0.5)
        body = orjson.dumps(spec(name="real"))
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/models", data=body, method="POST"
        )
        await asyncio.to_thread(urllib.request.urlopen, request, timeout=5)
        for _ in range(50):  # the tick after the apply fails, and the server reloads
            await asyncio.sleep(0.1)
            if failures and await asyncio.to_thread(models) == ["real"]:
                break
        seen = await asyncio.to_thread(models)
        stop.set()
        await serving
        return seen

    assert asyncio.run(main()) == ["real"], "the rolled-back model is not served"
    assert failures == ["ghost"]

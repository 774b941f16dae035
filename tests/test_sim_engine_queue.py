"""The sim engine queues like a real one: `--max-num-seqs` run at once, the rest wait in
arrival order, KV blocks bound what runs, and /metrics says so under each engine's own names."""

import asyncio
import re

import aiohttp
import pytest
from aiohttp import web

from sim.engine import EngineSettings, SimEngine
from sim.prefix_cache import BLOCK, CHARS_PER_TOKEN, PrefixCache
from sim.scheduler import Scheduler


async def started(settings: EngineSettings):
    engine = SimEngine(settings)
    runner = web.AppRunner(engine.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return engine, runner, f"http://127.0.0.1:{port}"


def series(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


async def complete(session, url, prompt="hi", tokens=4):
    body = {"model": "m", "prompt": prompt, "max_tokens": tokens}
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        return await resp.json()


def test_beyond_max_num_seqs_requests_wait_in_order_and_are_exported():
    async def scenario():
        settings = EngineSettings(["m"], tokens_per_s=20, output_tokens=4, max_num_seqs=2)
        engine, runner, url = await started(settings)
        try:
            async with aiohttp.ClientSession() as session:
                tasks = [asyncio.create_task(complete(session, url)) for _ in range(5)]
                await asyncio.sleep(0.1)
                async with session.get(url + "/metrics") as resp:
                    text = await resp.text()
                assert series(text, "vllm:num_requests_running") == 2
                assert series(text, "vllm:num_requests_waiting") == 3
                loop = asyncio.get_running_loop()
                start = loop.time()
                await asyncio.gather(*tasks)
                # three rounds of 0.2 s: 2 + 2 + 1
                assert loop.time() - start > 0.45
                async with session.get(url + "/metrics") as resp:
                    text = await resp.text()
                assert series(text, "vllm:num_requests_waiting") == 0
                assert series(text, "vllm:num_requests_running") == 0
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "kind,names",
    [
        ("sglang", ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage")),
        (
            "llama.cpp",
            (
                "llamacpp:requests_deferred",
                "llamacpp:requests_processing",
                "llamacpp:kv_cache_usage_ratio",
            ),
        ),
    ],
)
def test_each_engine_kind_exports_its_own_names(kind, names):
    async def scenario():
        engine, runner, url = await started(EngineSettings(["m"], kind=kind, kv_blocks=100))
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(url + "/metrics") as resp:
                    text = await resp.text()
            for name in names:
                assert series(text, name) == 0
            assert "vllm:" not in text
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_kv_blocks_bound_what_runs_and_the_cache_gives_way():
    async def scenario():
        cache = PrefixCache(capacity_tokens=100 * BLOCK)
        cache.serve("x" * (BLOCK * CHARS_PER_TOKEN * 50))  # 50 blocks cached
        queue = Scheduler(max_num_seqs=0, kv_blocks=100, cache=cache)
        first = await queue.admit(60)
        assert len(cache.blocks) <= 40 and queue.kv_usage == pytest.approx(0.6)
        second = asyncio.create_task(queue.admit(60))
        await asyncio.sleep(0)
        assert queue.waiting == 1 and queue.running == 1
        third = asyncio.create_task(queue.admit(10))
        await asyncio.sleep(0)
        assert queue.waiting == 2, "the head of the queue is never overtaken"
        queue.finish(first)
        assert await second == 60 and await third == 10
        assert queue.running == 2 and queue.kv_usage == pytest.approx(0.7)

    asyncio.run(scenario())


def test_a_waiting_request_whose_client_leaves_holds_nothing():
    async def scenario():
        queue = Scheduler(max_num_seqs=1, kv_blocks=0, cache=PrefixCache(0))
        held = await queue.admit(1)
        gone = asyncio.create_task(queue.admit(1))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert queue.waiting == 0
        queue.finish(held)
        assert queue.running == 0 and queue.held_blocks == 0

    asyncio.run(scenario())

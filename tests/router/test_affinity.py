"""Affinity keys, and the policy against least in flight on a multi-turn chat workload."""

import asyncio
import zlib

import pytest

from bench.affinity import Result, clear_caches, conversations, run_workload
from router.path.affinity import OFF, PREFIX, SESSION, affinity_key, prompt_prefix
from tests.harness import get, post


def engine_requests(engine: str) -> float:
    text = get(engine + "/metrics")[1].decode()
    return float(
        next(
            line.rsplit(" ", 1)[1]
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total{")
        )
    )


CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there"},
    ],
}


def test_an_explicit_session_wins_then_the_prompt_prefix():
    by_prefix = affinity_key(CHAT, None, PREFIX, 1024)
    assert by_prefix == zlib.crc32(b"<|system|>be brief<|user|>hello there") + 1
    assert affinity_key({**CHAT, "user": "u-7"}, None, PREFIX, 1024) == zlib.crc32(b"u-7") + 1
    header = b"s-1"  # X-Session-Id
    assert affinity_key({**CHAT, "user": "u-7"}, header, PREFIX, 1024) == zlib.crc32(b"s-1") + 1
    cache_key = {**CHAT, "prompt_cache_key": "k", "user": "u-7"}
    assert affinity_key(cache_key, header, PREFIX, 1024) == zlib.crc32(b"k") + 1
    assert affinity_key(CHAT, None, SESSION, 1024) == 0, "session mode needs a session"
    assert affinity_key({**CHAT, "user": "u"}, None, OFF, 1024) == 0
    assert affinity_key(None, None, PREFIX, 1024) == 0, "a form or bodiless request has no key"


def test_the_prefix_is_the_first_characters_of_the_prompt_as_the_engine_sees_it():
    assert prompt_prefix(CHAT, 12) == "<|system|>be"
    assert prompt_prefix({"prompt": "abcdef"}, 3) == "abc"
    assert prompt_prefix({"prompt": ["first", "second"]}, 100) == "first"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert prompt_prefix(parts, 100) == "<|user|>hi"
    # A part whose text is not a string has none (an image part, or a malformed one).
    odd = [{"type": "image_url", "image_url": {}}, {"text": None}, {"text": 7}, "x", {"text": "!"}]
    odd_parts = {"messages": [{"role": "user", "content": odd}]}
    assert prompt_prefix(odd_parts, 100) == "<|user|>!"
    turn2 = {
        "messages": CHAT["messages"]
        + [{"role": "assistant", "content": "hi!"}, {"role": "user", "content": "more"}]
    }
    assert affinity_key(turn2, None, PREFIX, 4096) == affinity_key(CHAT, None, PREFIX, 4096), (
        "later turns of a conversation keep its key"
    )
    other = {"messages": [CHAT["messages"][0], {"role": "user", "content": "another question"}]}
    assert affinity_key(other, None, PREFIX, 4096) != affinity_key(CHAT, None, PREFIX, 4096)


@pytest.mark.integration
def test_prefix_affinity_beats_least_in_flight_on_cache_hits(procs):
    engines = [
        procs.engine("m", cache_tokens=40_000, prefill_per_token=0.0002, ttft=0.01)
        for _ in range(3)
    ]
    sessions = conversations(24, 5)
    results: dict[str, Result] = {}
    for policy in (OFF, PREFIX):
        clear_caches(engines)
        router, proc = procs.router(*(f"--backend=m={e}" for e in engines), "--affinity", policy)
        results[policy] = asyncio.run(run_workload(router, engines, policy, sessions, rate=20))
        procs.terminate(proc)
    off, prefix = results[OFF], results[PREFIX]
    assert off.errors == prefix.errors == 0
    assert prefix.hit_rate > off.hit_rate + 0.02, (off.hit_rate, prefix.hit_rate)


@pytest.mark.integration
def test_a_routes_file_sets_affinity_per_model(procs, tmp_path):
    engines = [procs.engine("m", "n") for _ in range(3)]
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        f"m: {{affinity: off, endpoints: [{', '.join(engines)}]}}\nn: [{', '.join(engines)}]\n"
    )
    router, _ = procs.router("--routes", str(routes))
    body = b'{"model": "%s", "prompt": "the same prompt every time"}'

    def spread(model):
        before = [engine_requests(e) for e in engines]
        for _ in range(9):
            assert post(router + "/v1/completions", body % model.encode())[0] == 200
        return sum(1 for e, b in zip(engines, before, strict=True) if engine_requests(e) > b)

    assert spread("n") == 1, "prefix affinity: one prompt, one replica"
    assert spread("m") == 3, "affinity off for m: least in flight rotates over all"

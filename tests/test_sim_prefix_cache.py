"""The sim engine's prefix cache: a prompt that starts like a recent one is partly cached."""

from sim.prefix_cache import BLOCK, PrefixCache, prompt_text

SYSTEM = "You are a careful assistant. " * 40  # ~290 tokens shared by every conversation


def chat(*turns):
    return {
        "messages": [{"role": "system", "content": SYSTEM}]
        + [{"role": "user", "content": t} for t in turns]
    }


def test_a_shared_prefix_is_cached_whole_blocks_at_a_time():
    cache = PrefixCache(capacity_tokens=10_000)
    tokens, cached = cache.serve(prompt_text(chat("first question")))
    assert cached == 0 and tokens > 2 * BLOCK
    tokens2, cached2 = cache.serve(prompt_text(chat("first question", "and a follow-up")))
    assert cached2 % BLOCK == 0 and tokens - BLOCK <= cached2 <= tokens
    other = cache.serve(prompt_text({"prompt": "nothing in common " * 30}))
    assert other[1] == 0


def test_the_least_recently_used_blocks_go_first():
    cache = PrefixCache(capacity_tokens=BLOCK * 4)
    a = "a" * (BLOCK * 4 * 4)
    b = "b" * (BLOCK * 4 * 4)
    cache.serve(a)
    cache.serve(b)  # evicts a
    assert cache.serve(a)[1] == 0
    assert cache.hit_tokens == 0

"""What the router reads off an engine's `/metrics`: the series of its load, by engine kind,
and what a reading is. Both page readers (router/load/_loadread.pyx,
router/load/loadread_py.py) take the names from here.

Series, summed over their label sets (an engine with data-parallel ranks exports one each),
the KV use as the largest:

| engine    | waiting                    | running                      | KV-cache use (1: full)   |
|-----------|----------------------------|------------------------------|--------------------------|
| vLLM      | vllm:num_requests_waiting  | vllm:num_requests_running    | vllm:kv_cache_usage_perc |
|           |                            |                              | (vllm:gpu_cache_usage_…) |
| SGLang    | sglang:num_queue_reqs      | sglang:num_running_reqs      | sglang:token_usage       |
| llama.cpp | llamacpp:requests_deferred | llamacpp:requests_processing | llamacpp:kv_cache_usage_ |
|           |                            |                              | ratio                    |
"""

from __future__ import annotations

from typing import NamedTuple

WAITING, RUNNING, KV = 0, 1, 2
SERIES = {
    b"vllm:num_requests_waiting": WAITING,
    b"vllm:num_requests_running": RUNNING,
    b"vllm:kv_cache_usage_perc": KV,
    b"vllm:gpu_cache_usage_perc": KV,
    b"sglang:num_queue_reqs": WAITING,
    b"sglang:num_running_reqs": RUNNING,
    b"sglang:token_usage": KV,
    b"llamacpp:requests_deferred": WAITING,
    b"llamacpp:requests_processing": RUNNING,
    b"llamacpp:kv_cache_usage_ratio": KV,
}

# What a page reader's `feed` says of the bytes it was given.
NEED_MORE, COMPLETE, TOO_LARGE, NOT_HTTP = 0, 1, 2, 3


class BadReading(ValueError):
    pass


class Reading(NamedTuple):
    waiting: int
    running: int
    kv_use: float


def reading_of(totals: list[float]) -> Reading:
    return Reading(int(totals[WAITING]), int(totals[RUNNING]), min(totals[KV], 1.0))

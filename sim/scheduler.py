"""The simulated engine's scheduler, as vLLM's works in outline: at most `max_num_seqs`
sequences run at once, each holding KV-cache blocks for its prompt and output; the others wait
in arrival order (first come, first served: the head is never overtaken). A sequence starts
once a slot is free and its blocks fit beside the running ones; prefix-cache blocks that no
sequence holds are evicted, least recently used first, to make that room.

`waiting`, `running` and `kv_usage` are what the engine exports as its load: vLLM's
`num_requests_waiting`, `num_requests_running` and `kv_cache_usage_perc` (the share of blocks
held by running sequences; cached blocks nobody holds count as free, as vLLM counts them).
"""

from __future__ import annotations

import asyncio
from collections import deque

from sim.prefix_cache import BLOCK, PrefixCache


def blocks_for(tokens: int) -> int:
    return -(-max(0, tokens) // BLOCK)


class Scheduler:
    def __init__(self, max_num_seqs: int, kv_blocks: int, cache: PrefixCache) -> None:
        self.max_num_seqs = max_num_seqs  # 0: no limit
        self.kv_blocks = kv_blocks  # 0: no limit
        self.cache = cache
        self.running = 0
        self.held_blocks = 0
        self.queue: deque[tuple[int, asyncio.Future]] = deque()

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.held_blocks / self.kv_blocks) if self.kv_blocks else 0.0

    def fits(self, blocks: int) -> bool:
        if self.max_num_seqs and self.running >= self.max_num_seqs:
            return False
        # A sequence larger than the whole cache runs alone rather than never.
        return not self.kv_blocks or self.held_blocks + blocks <= self.kv_blocks or not self.running

    async def admit(self, blocks: int) -> int:
        """Wait for a slot and `blocks` KV blocks; returns the blocks held (give them back with
        `finish`). Cancelled while waiting, it leaves the queue and holds nothing."""
        if not self.queue and self.fits(blocks):
            return self._start(blocks)
        future = asyncio.get_running_loop().create_future()
        entry = (blocks, future)
        self.queue.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.finish(blocks)  # started just as its client went away
            else:
                self.queue.remove(entry)
                self._start_waiting()
            raise
        return blocks

    def finish(self, blocks: int) -> None:
        self.running -= 1
        self.held_blocks -= blocks
        self._start_waiting()

    def _start(self, blocks: int) -> int:
        self.running += 1
        self.held_blocks += blocks
        if self.kv_blocks:
            self.cache.evict_to(self.kv_blocks - self.held_blocks)
        return blocks

    def _start_waiting(self) -> None:
        while self.queue and self.fits(self.queue[0][0]):
            blocks, future = self.queue.popleft()
            if future.cancelled():
                continue
            self._start(blocks)
            future.set_result(None)

"""A simulated prefix (KV) cache, as engines keep one: what a replica saves on a prompt that
starts like one it served recently.

Prompts are cut into blocks of BLOCK tokens (a token here is about 4 characters, as engines'
tokenisers give on English). A block is identified by the hash of everything up to its end, so
a hit means the whole prefix matches (vLLM's automatic prefix caching works this way). The
cache holds `capacity_tokens` worth of blocks and forgets the least recently used.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import orjson

BLOCK = 16
CHARS_PER_TOKEN = 4


def prompt_text(body: dict) -> str:
    """The prompt as the engine would see it: chat messages in order, or `prompt`."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):  # parts: keep the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"<|{message.get('role', '')}|>{content or ''}")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    return prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()


class PrefixCache:
    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_blocks = max(0, capacity_tokens // BLOCK)
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.hit_tokens = 0
        self.prompt_tokens = 0

    @staticmethod
    def tokens(text: str) -> int:
        return max(1, len(text) // CHARS_PER_TOKEN)

    def serve(self, text: str) -> tuple[int, int]:
        """(prompt tokens, of which cached) for a prompt, which is then cached in turn."""
        tokens = self.tokens(text)
        chain = hashlib.blake2b(digest_size=16)
        cached, still_hitting = 0, True
        step = BLOCK * CHARS_PER_TOKEN
        for start in range(0, (tokens // BLOCK) * step, step):
            chain.update(text[start : start + step].encode())
            key = chain.digest()
            if still_hitting and key in self.blocks:
                cached += BLOCK
                self.blocks.move_to_end(key)
                continue
            still_hitting = False
            if self.capacity_blocks:
                self.blocks[key] = None
                if len(self.blocks) > self.capacity_blocks:
                    self.blocks.popitem(last=False)
        self.prompt_tokens += tokens
        self.hit_tokens += cached
        return tokens, cached

    def evict_to(self, blocks: int) -> None:
        """Forget the least recently used blocks until at most `blocks` remain (their room is
        wanted by running sequences)."""
        while len(self.blocks) > max(0, blocks):
            self.blocks.popitem(last=False)

    def clear(self) -> None:
        self.blocks.clear()
        self.hit_tokens = self.prompt_tokens = 0

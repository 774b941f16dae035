"""The affinity key of a request: which replica's prefix (KV) cache is likely to hold its
prompt already. Computed per request outside the table's lock; `acquire(model, key)` then
picks by rendezvous hashing with bounded loads.

- an explicit session first: `prompt_cache_key` in the body (as OpenAI's API names it), else
  an `X-Session-Id` header, else the body's `user`;
- otherwise (mode `prefix`) the root of the prompt as the engine sees it: for chat, the
  messages up to and including the first user message (the system prompt and the question
  that opened the conversation, the same at every later turn); for completions, `prompt`;
  at most `prefix_chars` characters of it.

The hash is CRC-32 (plus one, so that 0 stays "no key"): the same in every router process, so
that all routers and workers send a session to the same replica.
"""

from __future__ import annotations

from zlib import crc32

OFF, SESSION, PREFIX = "off", "session", "prefix"
MODES = (OFF, SESSION, PREFIX)
DEFAULT_PREFIX_CHARS = 4096


def stable_key(data: bytes) -> int:
    return crc32(data) + 1


def affinity_key(payload, session_id: bytes | None, mode: str, prefix_chars: int) -> int:
    """The key of a request whose body is `payload` (a dict, or the fields the body scan found,
    which decide the key in C unless a value needs Python's str()) and whose X-Session-Id
    header is `session_id` (None: it has none)."""
    if mode == OFF or payload is None:
        return 0
    if type(payload) is not dict:  # router.protocol._bodyscan.BodyFields
        scanned = payload
        key = scanned.affinity_key(session_id, mode == PREFIX, prefix_chars)
        if key >= 0:
            return key
        payload = scanned.loaded()
    if type(payload) is not dict:
        return 0
    fields = payload  # a dict: compiled, its lookups are C calls
    session = fields.get("prompt_cache_key") or session_id or fields.get("user")
    if session:
        return stable_key(session if type(session) is bytes else str(session).encode())
    if mode != PREFIX:
        return 0
    text = prompt_prefix(fields, prefix_chars)
    return stable_key(text.encode()) if text else 0


def prompt_prefix(payload: dict, chars: int) -> str:
    """The root of the prompt, at most `chars` characters, messages joined as `<|role|>text`.

    A fixed window of a growing conversation would change with every turn once the history is
    longer than the window's start: the conversation's first user message closes the root.
    """
    messages = payload.get("messages")
    if type(messages) is list:
        parts, length = [], 0
        for message in messages:
            if type(message) is not dict:
                continue
            content = message.get("content")
            if type(content) is list:  # content parts: the text ones
                content = "".join([_part_text(p) for p in content])
            role = message.get("role", "")
            part = f"<|{role}|>{content or ''}"
            parts.append(part)
            length += len(part)
            if length >= chars or role == "user":
                break
        return "".join(parts)[:chars]
    prompt = payload.get("prompt")
    if type(prompt) is list:
        prompt = prompt[0] if prompt else ""
    return prompt[:chars] if type(prompt) is str else ""


def _part_text(part) -> str:
    text = part.get("text") if type(part) is dict else None
    return text if type(text) is str else ""

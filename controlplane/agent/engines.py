"""How the agent puts an engine to sleep, wakes it, and asks whether it sleeps, by kind.

| kind      | sleep                           | wake                           | asleep?       |
|-----------|---------------------------------|--------------------------------|---------------|
| vllm      | POST /sleep?level=N             | POST /wake_up                  | /is_sleeping  |
| sglang    | POST /release_memory_occupation | POST /resume_memory_occupation | (its answer)  |
| llama.cpp | by itself, --sleep-idle-seconds | by itself, on the next request | /props        |
| custom    | the spec's `engine.sleep` path  | `engine.wake`                  | `engine.asleep` |

vLLM and SGLang answer a sleep or wake call once it is done, so the answer is the news.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp

# Falling asleep offloads the weights to host memory: seconds for a large model, not minutes.
CALL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Control:
    sleep: str | None  # path to POST to put it to sleep; {level} filled in
    wake: str | None  # path to POST to wake it
    asleep: str | None  # path to GET whose JSON says whether it sleeps
    asleep_key: str = "is_sleeping"

    @property
    def takes_orders(self) -> bool:
        return self.sleep is not None and self.wake is not None


KINDS = {
    "vllm": Control("/sleep?level={level}", "/wake_up", "/is_sleeping"),
    "sglang": Control("/release_memory_occupation", "/resume_memory_occupation", None),
    "llama.cpp": Control(None, None, "/props"),
}


def control_of(engine: str | None, endpoints: dict | None) -> Control | None:
    """The engine's sleep control; None for an engine without one."""
    if engine == "custom" and endpoints:
        return Control(endpoints.get("sleep"), endpoints.get("wake"), endpoints.get("asleep"))
    return KINDS.get(engine or "")


async def order(session: aiohttp.ClientSession, base_url: str, path: str, level: int = 0) -> str:
    """POST a sleep or wake order; "" once done, else what went wrong."""
    url = base_url + path.replace("{level}", str(level))
    try:
        async with session.post(
            url, json={}, timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
        ) as resp:
            if resp.status >= 300:
                text = (await resp.text())[:200]
                return f"HTTP {resp.status} from {path}: {text}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{path}: {exc or type(exc).__name__}"
    return ""


async def sleeping(session: aiohttp.ClientSession, base_url: str, control: Control) -> bool | None:
    """Whether the engine says it sleeps (None when it cannot say)."""
    if control.asleep is None:
        return None
    try:
        async with session.get(
            base_url + control.asleep, timeout=aiohttp.ClientTimeout(total=2)
        ) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    value = body.get(control.asleep_key) if isinstance(body, dict) else None
    return value if isinstance(value, bool) else None


# Runtime LoRA adapters: vLLM (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and SGLang take the same
# bodies at these paths; an engine of no known kind is asked as vLLM is.
ADAPTER_PATHS = {
    "sglang": ("/load_lora_adapter", "/unload_lora_adapter"),
}
VLLM_ADAPTER_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


async def load_adapter(
    session: aiohttp.ClientSession, base_url: str, engine: str | None, name: str, source: str
) -> str:
    """ "" once the engine holds adapter `name` from `source`, else the engine's reason."""
    path = ADAPTER_PATHS.get(engine or "", VLLM_ADAPTER_PATHS)[0]
    return await _adapter_call(session, base_url + path, {"lora_name": name, "lora_path": source})


async def unload_adapter(
    session: aiohttp.ClientSession, base_url: str, engine: str | None, name: str
) -> str:
    path = ADAPTER_PATHS.get(engine or "", VLLM_ADAPTER_PATHS)[1]
    return await _adapter_call(session, base_url + path, {"lora_name": name})


async def _adapter_call(session: aiohttp.ClientSession, url: str, body: dict) -> str:
    try:
        async with session.post(
            url, json=body, timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
        ) as resp:
            if resp.status < 300:
                return ""
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{exc or type(exc).__name__}"
    try:  # OpenAI-shaped errors carry the engine's own words
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    return f"HTTP {resp.status}: {message[:200]}"

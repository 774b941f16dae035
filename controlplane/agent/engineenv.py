"""The environment an engine starts with: the agent's own, less what systemd meant for the
agent alone, plus a home and a model cache it can write.

Under the agent's unit (DynamicUser, ProtectSystem=strict) the agent's HOME is `/`, read-only,
and Hugging Face's cache would be `/.cache/huggingface`: a real engine's first download fails.
The engine gets HOME inside the node's state directory and HF_HOME inside the unit's cache
directory (CACHE_DIRECTORY, which systemd sets for CacheDirectory=), unless the agent's
environment already names a writable one; a replica's own `env` still overrides both.
"""

from __future__ import annotations

import os
from pathlib import Path

# systemd's hand-off to the agent's process: an engine that read these would notify, or feed
# a watchdog, in the agent's name.
FOR_THE_AGENT_ALONE = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS",
                       "LISTEN_PID", "CREDENTIALS_DIRECTORY")  # fmt: skip


def writable(path: str) -> bool:
    return bool(path) and path != "/" and os.access(path, os.W_OK)


def engine_environment(node_state: Path, agent_env: dict[str, str] | None = None) -> dict:
    env = dict(os.environ if agent_env is None else agent_env)
    for name in FOR_THE_AGENT_ALONE:
        env.pop(name, None)
    if not writable(env.get("HOME", "")):
        home = node_state / "home"
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        env["HOME"] = str(home)
    if "HF_HOME" not in env and env.get("CACHE_DIRECTORY"):
        # CacheDirectory= may name several, separated by colons: the first is the agent's.
        env["HF_HOME"] = str(Path(env["CACHE_DIRECTORY"].split(":")[0]) / "huggingface")
    return env

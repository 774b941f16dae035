"""`env_from`: values a replica needs that an operator keeps out of the control plane, read on
the node when the replica starts: from a file (a mounted secret), or from the agent's own
environment."""

from __future__ import annotations

import os
from pathlib import Path


class EnvFromError(Exception):
    pass


def resolve(env_from: dict) -> dict[str, str]:
    """{variable: value} for `env_from`'s {variable: {file: PATH} | {agent_env: NAME}}."""
    values = {}
    for variable, source in (env_from or {}).items():
        if "file" in source:
            try:
                values[variable] = Path(source["file"]).read_text().rstrip("\n")
            except OSError as exc:
                raise EnvFromError(
                    f"env_from {variable}: {source['file']}: {exc.strerror}"
                ) from None
        else:
            name = source["agent_env"]
            if name not in os.environ:
                raise EnvFromError(f"env_from {variable}: the agent's environment has no {name}")
            values[variable] = os.environ[name]
    return values

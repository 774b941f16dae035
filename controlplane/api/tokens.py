"""Token files: one token for every role, or a YAML mapping {admin, viewer, agent, router}."""

from __future__ import annotations

import secrets
from pathlib import Path

import yaml

from controlplane.vocabulary.auth import ROLES


def load_tokens(path: str | Path | None) -> dict[str, str]:
    """{role: token}; {} when no file is given (then no call needs a token)."""
    if not path:
        return {}
    text = Path(path).read_text().strip()
    if not text:
        raise ValueError(f"{path} is empty")
    loaded = yaml.safe_load(text)
    if isinstance(loaded, dict):
        unknown = set(loaded) - set(ROLES)
        if unknown:
            raise ValueError(f"{path}: unknown role(s) {', '.join(sorted(unknown))}")
        return {role: str(token) for role, token in loaded.items() if token}
    return dict.fromkeys(ROLES, text)


def write_tokens(path: Path) -> dict[str, str]:
    """A new token per role, readable by this user alone."""
    tokens = {role: secrets.token_urlsafe(24) for role in ROLES}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tokens))
    path.chmod(0o600)
    return tokens

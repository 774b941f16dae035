"""Secrets are write-only: `env` values go to the node that runs the replica and nowhere else.

Every read of a spec answers them as `<redacted>`, keys shown; an apply that sends
`<redacted>` back for a key keeps the value stored for it, so `gpuctl models NAME -o yaml`,
edited and applied again, changes only what was edited.
"""

from __future__ import annotations

from controlplane.vocabulary.model import ModelSpec
from controlplane.vocabulary.specs import SpecError

REDACTED = "<redacted>"


def public_spec(spec: ModelSpec) -> dict:
    """The spec as any reader sees it."""
    body = spec.to_dict()
    body["env"] = dict.fromkeys(spec.env, REDACTED)
    return body


def keep_stored(body, current: ModelSpec | None):
    """`body` with each `<redacted>` env value replaced by the stored one; SpecError naming the
    key when nothing is stored for it."""
    if not isinstance(body, dict) or not isinstance(body.get("env"), dict):
        return body
    env = dict(body["env"])
    for key, value in env.items():
        if value != REDACTED:
            continue
        if current is None or key not in current.env:
            raise SpecError(
                f"env.{key}",
                f"is {REDACTED} but no value is stored for it: give the value itself",
            )
        env[key] = current.env[key]
    return {**body, "env": env}

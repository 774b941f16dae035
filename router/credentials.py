"""Secrets handed over by systemd (`LoadCredential=`): files in $CREDENTIALS_DIRECTORY, which
only the service's own user can read, whatever owner and mode they have under /etc/gpufleet.

A program asks for a credential by its name in the unit when the flag for it was not given.
An empty one is none: the units give the optional ones an empty default (`SetCredential=`), so
that a missing file does not stop the service from starting. The control plane keeps its own copy
(controlplane/vocabulary/credentials.py): the control plane and the router share no code.
"""

from __future__ import annotations

import os


def credential(name: str) -> str | None:
    """The path of credential `name`, or None: not handed over, or empty."""
    folder = os.environ.get("CREDENTIALS_DIRECTORY", "")
    if not folder:
        return None
    path = os.path.join(folder, name)
    try:
        return path if os.path.getsize(path) > 0 else None
    except OSError:
        return None


def credential_text(name: str) -> str | None:
    path = credential(name)
    if path is None:
        return None
    with open(path) as f:
        return f.read().strip() or None

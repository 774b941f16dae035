"""Who may call what: roles from the token file, node credentials bound to a node's name.

| caller                          | may                                                     |
|---------------------------------|---------------------------------------------------------|
| no token, or one nobody issued  | `/healthz`, `/v1/leader`, `/metrics` (unless it has a    |
|                                 | token of its own); anything else: 401                    |
| `viewer`                        | read: nodes, models, replicas, routers, summary          |
| `router`                        | routes, activity, demand                                 |
| `agent` (the bootstrap token)   | register a node that has no credential yet               |
| a node's credential             | that node's heartbeat, assignments and re-registration   |
| `admin`                         | everything                                              |

A known token of the wrong role gets 403, saying which role the call needs. With no token file
at all (a laptop, the tests' default) nothing needs a token. Node credentials are random,
given once at registration, and kept only as their SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

ROLES = ("admin", "viewer", "router", "agent")
PUBLIC = "public"
NODE = "node"  # the credential of the node the path names
READ = ("viewer", "router")  # what may read the fleet's tables


@dataclass(frozen=True)
class Caller:
    roles: frozenset[str]  # empty for a node credential
    node: str | None = None  # the node a credential is bound to

    def describe(self) -> str:
        if self.node is not None:
            return f"node {self.node}'s credential"
        return " / ".join(sorted(self.roles)) + " token"


class Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def new_credential() -> tuple[str, str]:
    """(the credential to give the node once, what to keep of it)."""
    token = "gfn_" + secrets.token_urlsafe(32)
    return token, digest(token)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def identify(header: str, tokens: dict[str, str], credentials: dict[str, str]) -> Caller | None:
    """The caller a bearer token names (None: no token, or one nobody issued).
    `credentials`: node -> digest of its credential."""
    if not header.startswith("Bearer "):
        return None
    given = header[7:].strip()
    if not given:
        return None
    roles = frozenset(
        role
        for role, token in tokens.items()
        if token and hmac.compare_digest(given.encode(), token.encode())
    )
    if roles:
        return Caller(roles)
    hashed = digest(given)
    for node, kept in credentials.items():
        if hmac.compare_digest(hashed, kept):
            return Caller(frozenset(), node)
    return None


def check(caller: Caller | None, needs: tuple[str, ...], node: str | None = None) -> None:
    """Raise Denied unless `caller` may make a call that `needs` one of these roles (NODE: the
    credential of `node`, the node the call is about). Admin may do anything."""
    if PUBLIC in needs:
        return
    if caller is None:
        wanted = " or ".join(r if r != NODE else "a node credential" for r in needs)
        raise Denied(401, f"this call needs a token ({wanted}); none was given or it is unknown")
    if "admin" in caller.roles or caller.roles.intersection(needs):
        return
    if NODE in needs and caller.node is not None and caller.node == node:
        return
    if NODE in needs:
        raise Denied(
            403,
            f"a {caller.describe()} may not act for node {node}: this call needs node {node}'s"
            " own credential (given at its registration) or the admin token",
        )
    roles = " or ".join(("admin", *needs)) if "admin" not in needs else " or ".join(needs)
    raise Denied(403, f"this call needs the {roles} role; a {caller.describe()} was given")

"""Who may call what: roles from the token file, node credentials bound to a node's name.

| caller                          | may                                                     |
|---------------------------------|---------------------------------------------------------|
| no token, or one nobody issued  | `/healthz`, `/v1/leader`, `/metrics` (unless it has a    |
|                                 | token of its own); anything else: 401                    |
| `viewer`                        | read: nodes, models, replicas, routers, summary          |
| `router`                        | routes, activity, demand, and nothing else               |
| `agent` (the bootstrap token)   | register a node that has no credential yet               |
| a node's credential             | that node's heartbeat, assignments and re-registration   |
| `admin`                         | everything but a node's own calls, whose answers carry    |
|                                 | `env` values in clear                                    |

A known token of the wrong role gets 403, saying which role the call needs. With no token file
at all (a laptop, the tests' default) nothing needs a token. Node credentials are random,
given once at registration, and kept only as their SHA-256. A credential is found by its
digest in a map: a call costs one hash and one lookup at 16,000 nodes as at 4, and an unknown
token costs no more than a known one (a digest reveals nothing of the token, so the lookup
need not be constant-time).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

ROLES = ("admin", "viewer", "router", "agent")
PUBLIC = "public"
NODE = "node"  # the credential of the node the path names
NODE_ONLY = (NODE,)  # that credential and nobody else, admin included
READ = ("viewer",)  # what may read the fleet's tables


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


class Credentials:
    """The digest of each node's credential, and the node of each digest."""

    def __init__(self, digests: dict[str, str]) -> None:
        self.digests: dict[str, str] = {}  # node -> digest
        self.nodes: dict[str, str] = {}  # digest -> node
        for node, kept in digests.items():
            self[node] = kept

    def __contains__(self, node: str) -> bool:
        return node in self.digests

    def __len__(self) -> int:
        return len(self.digests)

    def __setitem__(self, node: str, kept: str) -> None:
        self.pop(node)
        self.digests[node] = kept
        self.nodes[kept] = node

    def pop(self, node: str) -> str | None:
        kept = self.digests.pop(node, None)
        if kept is not None:
            self.nodes.pop(kept, None)
        return kept

    def node_of(self, kept: str) -> str | None:
        return self.nodes.get(kept)


NO_CREDENTIALS = Credentials({})


def identify(header: str, tokens: dict[str, str], credentials: Credentials) -> Caller | None:
    """The caller a bearer token names (None: no token, or one nobody issued)."""
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
    node = credentials.node_of(digest(given))
    return None if node is None else Caller(frozenset(), node)


def check(caller: Caller | None, needs: tuple[str, ...], node: str | None = None) -> None:
    """Raise Denied unless `caller` may make a call that `needs` one of these roles (NODE: the
    credential of `node`, the node the call is about). Admin may do anything but the calls
    that only a node's own credential may make (NODE_ONLY)."""
    if PUBLIC in needs:
        return
    if needs == NODE_ONLY:
        if caller is not None and caller.node is not None and caller.node == node:
            return
        if caller is None:
            raise Denied(
                401, "this call needs a token (a node credential); none was given or it is unknown"
            )
        raise Denied(
            403,
            f"this call needs node {node}'s own credential (given at its registration), and no"
            " other token, admin's included: its answer carries env values in clear",
        )
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

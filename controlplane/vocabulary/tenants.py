"""Tenants: who calls the routers, what they may call, and how much of it.

A tenant is an operator's object (`kind: tenant`) kept as a record, as adapters are. Its keys
are made here, shown once, and kept as their SHA-256 only; routers receive the digests with
the routes and know a tenant from a request's key with one hash and one lookup.
"""

from __future__ import annotations

import fnmatch
import math
import re
import secrets
from dataclasses import asdict, dataclass, field

from controlplane.vocabulary.auth import digest
from controlplane.vocabulary.specs import SpecError, parse_name, parse_priority

TENANT_FIELDS = {
    "kind", "name", "models", "requests_per_minute", "tokens_per_minute", "max_in_flight",
    "weight", "priority", "default_max_tokens", "generation",
}  # fmt: skip
# Beyond these a value is a typing slip, not a plan: a whole fleet serves far less.
MAX_REQUESTS_PER_MINUTE = 100_000_000
MAX_TOKENS_PER_MINUTE = 100_000_000_000
MAX_IN_FLIGHT = 1_000_000
MAX_WEIGHT = 1000.0
MAX_DEFAULT_TOKENS = 1_000_000
DEFAULT_MAX_TOKENS = 256  # what a request that names no max_tokens is admitted against
MODEL_PATTERN = re.compile(r"^[A-Za-z0-9._:/*?\[\]@-]{1,200}$")
KEY_PREFIX = "gfk_"


@dataclass
class Tenant:
    name: str
    models: list[str] = field(default_factory=list)  # names or globs; empty: every model
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_in_flight: int | None = None
    weight: float = 1.0
    priority: int = 0
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    generation: int = 0

    def to_dict(self) -> dict:
        return {"kind": "tenant", **asdict(self)}

    @classmethod
    def from_dict(cls, body: dict) -> Tenant:
        return cls(**{k: v for k, v in body.items() if k != "kind"})

    def may_call(self, model: str) -> bool:
        return not self.models or any(fnmatch.fnmatchcase(model, p) for p in self.models)

    @property
    def limited(self) -> bool:
        return any(
            v is not None
            for v in (self.requests_per_minute, self.tokens_per_minute, self.max_in_flight)
        )


@dataclass
class TenantKey:
    id: str
    tenant: str
    digest: str  # SHA-256 of the key, hex
    created: float
    last_used: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, body: dict) -> TenantKey:
        return cls(**body)

    def row(self) -> dict:
        """What operators are shown: never the key, nor its digest."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "created": self.created,
            "last_used": self.last_used,
        }


def new_key(tenant: str, now: float) -> tuple[str, TenantKey]:
    """(the key, shown once; what is kept of it)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, TenantKey("key-" + secrets.token_hex(6), tenant, digest(key), now)


def validate_tenant(body) -> Tenant:
    """A Tenant from an operator's mapping, or SpecError naming the first bad field."""
    if not isinstance(body, dict):
        raise SpecError("tenant", "expected a mapping")
    unknown = sorted(set(body) - TENANT_FIELDS)
    if unknown:
        raise SpecError(unknown[0], "unknown field")
    if body.get("kind", "tenant") != "tenant":
        raise SpecError("kind", "expected tenant")
    return Tenant(
        name=parse_name(body),
        models=_models(body.get("models")),
        requests_per_minute=_limit(body, "requests_per_minute", MAX_REQUESTS_PER_MINUTE),
        tokens_per_minute=_limit(body, "tokens_per_minute", MAX_TOKENS_PER_MINUTE),
        max_in_flight=_limit(body, "max_in_flight", MAX_IN_FLIGHT),
        weight=_weight(body.get("weight", 1.0)),
        priority=parse_priority(body),
        default_max_tokens=_limit(body, "default_max_tokens", MAX_DEFAULT_TOKENS)
        or DEFAULT_MAX_TOKENS,
    )


def _models(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError("models", "expected a list of model names or globs")
    for pattern in value:
        if not MODEL_PATTERN.match(pattern):
            raise SpecError("models", f"{pattern!r} is not a model name or glob")
    return sorted(set(value))


def _limit(body: dict, name: str, most: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(name, f"expected a whole number, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise SpecError(name, f"expected a whole number, got {value!r}")
    if value < 1:
        raise SpecError(name, "must be at least 1 (leave it out for no limit)")
    if value > most:
        raise SpecError(name, f"must be at most {most:,}")
    return int(value)


def _weight(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError("weight", f"expected a number, got {value!r}")
    if not 0 < value <= MAX_WEIGHT:
        raise SpecError("weight", f"must be above 0 and at most {MAX_WEIGHT:g}")
    return float(value)

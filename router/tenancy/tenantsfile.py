"""`gpurouter --tenants-file`: tenants for a router without a control plane.

    tenants:
      - name: team-a
        models: [llama-*]            # names or globs; none: every model
        requests_per_minute: 600     # each limit optional
        tokens_per_minute: 200000
        max_in_flight: 32
        weight: 1
        priority: 0
        key_sha256: [<64 hex digits>, ...]   # the SHA-256 of each key, never the key

A router alone holds each whole limit (its share is the limit, with no lease to lapse).
"""

from __future__ import annotations

import math
import re

import yaml

HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
LIMITS = ("requests_per_minute", "tokens_per_minute", "max_in_flight", "default_max_tokens")
SHARED_LIMITS = LIMITS[:3]  # split among the workers, in the order of a share
FIELDS = {"name", "models", "weight", "priority", "key_sha256", *LIMITS}


def read_tenants_file(path: str, router_id: str, workers: int = 1, worker: int = 0) -> dict:
    """The part of a routing table a control plane would send (router/tenancy/tenants.py), or
    ValueError naming the file, the tenant and the field. With `workers` processes on one
    port, worker number `worker` holds its part of every limit (`worker_share`): together
    they hold the whole, never more."""
    with open(path) as f:
        try:
            loaded = yaml.safe_load(f) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
    entries = loaded.get("tenants") if isinstance(loaded, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected `tenants:`, a list of tenants")
    tenants, keys = {}, {}
    for index, entry in enumerate(entries):
        where = f"{path}: tenants[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"{where}: a mapping with a `name`")
        unknown = sorted(set(entry) - FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}")
        name = entry["name"]
        rules = {"models": _models(entry.get("models"), where)}
        for limit in LIMITS:
            rules[limit] = _limit(entry.get(limit), f"{where}.{limit}")
        rules["weight"] = _weight(entry.get("weight", 1.0), f"{where}.weight")
        priority = entry.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"{where}.priority: an integer")
        rules["priority"] = priority
        rules["shares"] = {router_id: worker_shares(rules, workers, worker)}
        tenants[name] = rules
        digests = entry.get("key_sha256") or []
        if not isinstance(digests, list):
            raise ValueError(f"{where}.key_sha256: a list of SHA-256 digests")
        for number, digest in enumerate(digests):
            if not isinstance(digest, str) or not HEX_DIGEST.match(digest.lower()):
                raise ValueError(f"{where}.key_sha256[{number}]: 64 hex digits")
            keys[digest.lower()] = [name, f"{name}-{number}"]
    return {"share_lease_s": math.inf, "tenants": tenants, "keys": keys}


def worker_shares(rules: dict, workers: int, worker: int) -> list:
    """Worker `worker`'s part of each limit among `workers`, in the order of a share: each
    rate's even part (a bucket of a fraction of a request still admits one, in its time), and
    whole requests in flight dealt out one by one, so that 2 in flight among 4 workers are one
    each on two of them and none on the others: together never more than the limit."""
    workers = max(workers, 1)
    requests, tokens, in_flight = (rules[limit] or 0 for limit in SHARED_LIMITS)
    whole = in_flight // workers + (1 if worker % workers < in_flight % workers else 0)
    return [requests / workers, tokens / workers, whole]


def _models(value, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}.models: a list of model names or globs")
    return value


def _limit(value, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: a whole number of at least 1")
    return value


def _weight(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1000:
        raise ValueError(f"{where}: a number above 0, at most 1000")
    return float(value)

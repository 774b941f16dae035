"""Lists a page at a time, as Kubernetes' `limit` and `continue` do.

A page ends with a `continue` token that names the last row it holds; the next page starts
after that row in the list as it is when asked. A row is never listed twice and rows that
stay are never missed; one added or removed meanwhile shows or not by where it sorts, as a
`kubectl get --chunk-size` of a changing cluster does.
"""

from __future__ import annotations

import base64
import binascii
from bisect import bisect_right
from collections.abc import Callable

import orjson

MAX_LIMIT = 10_000


class BadPage(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def token_after(key: tuple) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).decode().rstrip("=")


def key_of(token: str) -> tuple:
    try:
        key = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise BadPage("continue", "not a token this server gave") from None
    if not isinstance(key, list) or not all(isinstance(part, str) for part in key):
        raise BadPage("continue", "not a token this server gave")
    return tuple(key)


def parse_limit(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise BadPage("limit", f"a whole number from 1 to {MAX_LIMIT}")
    return limit


def bounds(rows: list, sort_key: Callable, limit: str | None, token: str | None):
    """(start, end, metadata) of the page of `rows` (sorted by `sort_key`) that `limit` and
    `token` ask for; metadata holds `continue` and `remaining` when more follow."""
    size = parse_limit(limit)
    start = bisect_right(rows, key_of(token), key=sort_key) if token else 0
    end = len(rows) if size is None else min(len(rows), start + size)
    if end == len(rows):
        return start, end, {}
    return (
        start,
        end,
        {"continue": token_after(sort_key(rows[end - 1])), "remaining": len(rows) - end},
    )


def page(
    rows: list[dict], sort_key: Callable[[dict], tuple], limit: str | None, token: str | None
) -> tuple[list[dict], dict]:
    """(the rows of this page, the list's metadata). `rows` must be sorted by `sort_key`."""
    start, end, metadata = bounds(rows, sort_key, limit, token)
    return rows[start:end], metadata

"""The engine load page reader in Python (httptools and a regular expression): the twin of
router/load/_loadread.pyx, used with GPUROUTER_NO_EXTENSIONS=1 and held to the same answers by the
differential tests."""

from __future__ import annotations

import math
import re

import httptools

from router.load.loadseries import (
    COMPLETE,
    KV,
    NEED_MORE,
    NOT_HTTP,
    SERIES,
    TOO_LARGE,
    BadReading,
    Reading,
    reading_of,
)

# A known name at the start of a line, its labels (quoted values may hold braces and escaped
# quotes), its value.
SAMPLE = re.compile(
    rb"^(" + b"|".join(re.escape(name) for name in SERIES) + rb")"
    rb'(\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\})?[ \t]+(\S*)',
    re.M,
)
NUMBER = re.compile(rb"[0-9eE.+-]+")  # what a finite sample value may hold (no `_`, no hex)


def scan_load(page: bytes) -> Reading | None:
    """The load a Prometheus text page gives, looking only for the known series; None when it
    names none of them; BadReading when one's value is not a finite non-negative number."""
    totals = [0.0, 0.0, 0.0]
    seen = False
    for name, _, raw in SAMPLE.findall(page):
        try:
            if NUMBER.fullmatch(raw) is None:  # NaN, Inf, words, hex, underscores
                raise ValueError
            value = float(raw)
        except ValueError:
            raise BadReading(f"not a finite number: {raw[:20]!r}") from None
        if not math.isfinite(value) or value < 0:
            raise BadReading(f"not a finite non-negative number: {value}")
        field = SERIES[name]
        if field == KV:
            totals[KV] = max(totals[KV], value)
        else:
            totals[field] += value
        seen = True
    return reading_of(totals) if seen else None


class PageReader:
    """The answers to GET /metrics on one connection, one at a time: `feed` the bytes as they
    come (NEED_MORE, COMPLETE, TOO_LARGE past `max_bytes` of body, NOT_HTTP), then `status`,
    `keep_alive` and `reading()`; `next()` before the next answer."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.keep_alive = False
        self.state = NEED_MORE
        self.size = 0
        self.chunks: list[bytes] = []
        self.length: bytes | None = None
        self.chunked = False

    def feed(self, data: bytes) -> int:
        if self.state != NEED_MORE:
            return NOT_HTTP  # bytes nobody asked for
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            return TOO_LARGE if self.state == TOO_LARGE else NOT_HTTP
        return self.state

    def feed_eof(self) -> int:
        """The engine closed the connection: an answer whose body ran to the close is
        complete."""
        if self.state == NEED_MORE and self.status and not self.framed():
            self.state = COMPLETE
            self.keep_alive = False
        return self.state if self.state == COMPLETE else NOT_HTTP

    def framed(self) -> bool:
        return self.length is not None or self.chunked

    def next(self) -> None:
        self.state = NEED_MORE
        self.status = self.size = 0
        self.chunks = []

    def reading(self) -> Reading | None:
        return scan_load(b"".join(self.chunks))

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self.length, self.chunked = None, False

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.length = value
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_bytes:
            self.state = TOO_LARGE
            raise httptools.HttpParserError("too large")
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self.state = COMPLETE

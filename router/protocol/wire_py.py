"""The readers of `router.protocol._wire` on httptools' Python callbacks: the same answers, for
GPUROUTER_NO_EXTENSIONS=1 and for a checkout whose extensions were not built."""

from __future__ import annotations

import os
import time

import httptools

from router.protocol.errors import REASONS, InvalidResponse, RequestRefused
from router.protocol.forwarding import (
    CHUNK_END,
    MAX_ANSWER_HEAD_BYTES,
    NOT_FORWARDED,
    NOT_RELAYED,
    ONE_KEY,
    READ_BY_ROUTER,
    READ_FIELDS,
    headers_of,
)


class Request:
    """One request as the client sent it, read whole."""

    def bound_completion(self, bound: int) -> None:
        """The JSON object body with `"max_tokens": bound` last at its top level (the last of
        a repeated key is the one engines keep): what it was admitted against."""
        self.body = with_max_tokens(self.body, bound)

    __slots__ = ("method", "url", "path", "forward", "body", "keep_alive", *READ_FIELDS.values())

    def __init__(self) -> None:
        for field in READ_FIELDS.values():  # the headers the router reads: None when absent
            setattr(self, field, None)

    def __repr__(self) -> str:
        return f"Request({self.method!r}, {self.url!r})"

    @property
    def headers(self) -> dict[bytes, bytes]:
        return headers_of(self)

    def upstream(
        self, path_prefix: bytes, host: bytes, forward: bytes, peer: bytes, request_id: bytes
    ) -> bytes:
        """The request as it goes to a replica, in one bytes object: `forward`'s header lines,
        then Host, X-Forwarded-For (the client's, extended with `peer`), X-Request-Id and the
        body's length written by the router."""
        forwarded_for = self.x_forwarded_for
        return b"".join(
            (
                self.method,
                b" ",
                path_prefix,
                self.url,
                b" HTTP/1.1\r\nhost: ",
                host,
                b"\r\n",
                forward,
                b"x-forwarded-for: ",
                forwarded_for + b", " + peer if forwarded_for else peer,
                b"\r\nx-request-id: ",
                request_id,
                b"\r\ncontent-length: ",
                str(len(self.body)).encode(),
                b"\r\n\r\n",
                self.body,
            )
        )


class RequestReader:
    """Reads the requests of one client connection; each one read whole is appended to
    `pending`. `feed` raises RequestRefused for what the router will not take."""

    def __init__(self, pending, max_header_bytes: int, max_body_bytes: int) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.pending = pending
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.mid_message = False
        self.continue_wanted = False  # the request being read expects 100 Continue
        self.completed = 0

    def feed(self, data: bytes) -> int:
        """Reads `data`; returns how many requests it completed."""
        self.completed = 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, RequestRefused):
                raise cause from None
            raise RequestRefused(400, "malformed HTTP request") from exc
        except httptools.HttpParserUpgrade:
            raise RequestRefused(400, "protocol upgrades are not supported") from None
        except httptools.HttpParserError as exc:
            raise RequestRefused(400, f"malformed HTTP request: {exc}") from None
        return self.completed

    def _count_head(self, size: int) -> None:
        self.header_bytes += size
        if self.header_bytes > self.max_header_bytes:
            raise RequestRefused(431, "request headers are too large")

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.url = b""
        self.request = Request()
        self.forward: list[bytes] = []
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.mid_message = True
        self.continue_wanted = False

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        name = name.lower()
        if name in READ_BY_ROUTER:
            if name == b"authorization" and self.request.authorization is not None:
                raise RequestRefused(400, ONE_KEY)
            setattr(self.request, READ_FIELDS[name], value)
        if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
            raise RequestRefused(413, "request body is too large")
        if name == b"expect" and value.lower() == b"100-continue":
            # HTTP/1.0 clients cannot take an interim answer (RFC 9110, 10.1.1).
            self.continue_wanted = self.parser.get_http_version() != "1.0"
        if name not in NOT_FORWARDED:
            self.forward.append(b"%s: %s\r\n" % (name, value))

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            raise RequestRefused(413, "request body is too large")
        self.body.append(body)

    def on_message_complete(self) -> None:
        request = self.request
        request.method = self.parser.get_method()
        request.url = self.url
        request.path = self.url.partition(b"?")[0]
        request.forward = b"".join(self.forward)
        request.body = b"".join(self.body)
        request.keep_alive = self.parser.should_keep_alive()
        self.pending.append(request)
        self.completed += 1
        self.mid_message = self.continue_wanted = False


class ResponseReader:
    """`router.protocol._wire.ResponseReader` on httptools: the same calls to `sink`, the same
    `relay_head`, `feed_eof`, `length_given`, `sse`, `headers_done` and `framed`."""

    def __init__(self, sink) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.sink = sink
        self.head = self.reason = b""
        self.status = 0
        self.length_given = self.sse = self.headers_done = self.framed = False
        self.body_begun = False  # some of this answer's body has been read
        self.interim = False
        self.head_bytes = 0
        self.body: list[bytes] = []

    def relay_head(self, request_id: bytes, close: bool, extra: bytes = b"") -> None:
        """The head the client gets goes out ahead of the body (`router.protocol._wire`'s)."""
        reason = self.reason or REASONS.get(self.status, b"")
        head = b"".join(
            (
                b"HTTP/1.1 %d %s\r\n" % (self.status, reason),
                self.head,
                b"" if self.length_given else b"transfer-encoding: chunked\r\n",
                b"connection: close\r\n" if close else b"",
                extra,
                b"x-request-id: ",
                request_id,
                b"\r\n\r\n",
            )
        )
        self.body.append(head)

    def feed_eof(self) -> bool:
        """The replica closed the connection: an answer whose body runs to the close (neither
        length nor chunks) is complete, and True; any other is not, and nothing is told."""
        if not self.headers_done or self.framed:
            return False
        self.headers_done = False
        self.body.append(CHUNK_END)
        self._pass_body()
        self.sink.answer_complete(False)
        return True

    def feed(self, data: bytes) -> int:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, InvalidResponse):
                raise exc.__context__ from None
            raise InvalidResponse("the router failed on this answer") from exc.__context__
        except httptools.HttpParserError as exc:
            self._pass_body()
            raise InvalidResponse(str(exc)) from None
        try:
            self._pass_body()
        except Exception as exc:
            raise InvalidResponse("the router failed on this answer") from exc
        return 0

    def _pass_body(self) -> None:
        if self.body:
            data = b"".join(self.body)
            self.body.clear()
            self.sink.answer_body(data)

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.reason = b""
        self.head_bytes = 0
        self.relayed: list[bytes] = []
        self.length_given = self.sse = self.headers_done = self.framed = False
        self.body_begun = False

    def _count_answer_head(self, size: int) -> None:
        # httptools tells of a header once it is whole: the limit holds per header here, where
        # the C reader counts the bytes as they arrive.
        self.head_bytes += size
        if self.head_bytes > MAX_ANSWER_HEAD_BYTES:
            raise InvalidResponse(f"the answer's head is larger than {MAX_ANSWER_HEAD_BYTES} bytes")

    def on_status(self, reason: bytes) -> None:
        self._count_answer_head(len(reason))
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_answer_head(len(name) + len(value))
        lower = name.lower()
        if lower in NOT_RELAYED:
            if lower == b"content-length":
                self.framed = self.length_given = True
                self.relayed.append(b"content-length: %s\r\n" % value)
            elif lower == b"transfer-encoding":
                self.framed = True
            return
        if lower == b"content-type" and value.startswith(b"text/event-stream"):
            self.sse = True
        self.relayed.append(b"%s: %s\r\n" % (name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103 Early Hints): the answer is still to come.
            self.interim = True
            return
        self.headers_done = True
        self.status = status
        self.head = b"".join(self.relayed)
        self.sink.answer_head(status)

    def on_body(self, body: bytes) -> None:
        if not body:  # an empty chunk would end the answer
            return
        self.body_begun = True
        if self.length_given:
            self.body.append(body)
        else:
            self.body.append(b"%x\r\n%s\r\n" % (len(body), body))

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if not self.length_given:
            self.body.append(CHUNK_END)
        self._pass_body()
        self.sink.answer_complete(self.parser.should_keep_alive())


monotonic = time.monotonic  # the router's one clock


def send_now(fd: int, data: bytes) -> int:
    """As much of `data` as the socket `fd` takes at once: how many bytes, 0 where its buffer
    is full, -1 on an error (left for the transport to meet and report)."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError:
        return -1


def numbered(prefix: bytes, number: int) -> bytes:
    """`prefix` then `number` in decimal (not negative): request ids."""
    if number < 0:
        raise ValueError("numbered takes a number that is not negative")
    return prefix + str(number).encode()


def ratelimit_lines(
    requests_prefix: bytes,
    requests_left: int,
    requests_reset_ms: int,
    tokens_prefix: bytes,
    tokens_left: int,
    tokens_reset_ms: int,
) -> bytes:
    """A limited tenant's x-ratelimit-* lines (`_wire`'s)."""
    lines = b""
    if requests_prefix:
        lines += b"%s%d\r\nx-ratelimit-reset-requests: %s\r\n" % (
            requests_prefix,
            max(0, requests_left),
            reset_text(requests_reset_ms),
        )
    if tokens_prefix:
        lines += b"%s%d\r\nx-ratelimit-reset-tokens: %s\r\n" % (
            tokens_prefix,
            max(0, tokens_left),
            reset_text(tokens_reset_ms),
        )
    return lines


def reset_text(reset_ms: int) -> bytes:
    if reset_ms < 1000:
        return b"%dms" % max(0, reset_ms)
    seconds = (reset_ms + 999) // 1000
    return b"%dm%ds" % divmod(seconds, 60) if seconds >= 60 else b"%ds" % seconds


MAX_COUNT_DIGITS = 12  # more is no count of tokens
JSON_SPACE = b" \t\r\n"


def with_max_tokens(body: bytes, bound: int) -> bytes:
    """`body`, a JSON object, with `"max_tokens": bound` appended at its top level."""
    head = body.rstrip()
    inside = head[:-1].rstrip()
    comma = b"" if inside.endswith(b"{") else b","
    return b'%s%s"max_tokens":%d}' % (inside, comma, bound)


def number_after(data: bytes, name: bytes) -> int:
    """The whole number after the last `name:` in `data` (JSON), or -1 (`_wire`'s)."""
    at = data.rfind(name)
    if at < 0 or len(name) < 2:
        return -1
    rest = data[at + len(name) :].lstrip(JSON_SPACE)
    if not rest.startswith(b":"):
        return -1
    rest = rest[1:].lstrip(JSON_SPACE)
    digits = 0
    while digits < len(rest) and 48 <= rest[digits] <= 57:
        digits += 1
    if digits == 0 or digits > MAX_COUNT_DIGITS:
        return -1  # none, or too long to be a count of tokens
    return int(rest[:digits])


def usage_tokens(data: bytes) -> int:
    """The engine's `usage` packed in one integer, or -1 (`_wire`'s)."""
    prompt = number_after(data, b'"prompt_tokens"')
    completion = number_after(data, b'"completion_tokens"')
    if not 0 <= prompt < 1 << 31 or not 0 <= completion < 1 << 31:
        return -1
    return prompt << 32 | completion

"""The one place that decides which HTTP readers the router uses: `router.protocol._wire`
(llhttp's C callbacks) unless GPUROUTER_NO_EXTENSIONS=1 is set or it was not built, in which case
`router.protocol.wire_py` (httptools), with the same API."""

from router.compiled import implementation
from router.protocol import wire_py

_impl = implementation("router.protocol._wire", wire_py)

Request = _impl.Request
RequestReader = _impl.RequestReader
ResponseReader = _impl.ResponseReader
numbered = _impl.numbered
number_after = _impl.number_after
usage_tokens = _impl.usage_tokens
with_max_tokens = _impl.with_max_tokens
ratelimit_lines = _impl.ratelimit_lines
monotonic = _impl.monotonic
send_now = _impl.send_now
USING_EXTENSION = _impl is not wire_py

__all__ = [
    "Request",
    "RequestReader",
    "ResponseReader",
    "USING_EXTENSION",
    "monotonic",
    "send_now",
    "number_after",
    "usage_tokens",
    "numbered",
    "ratelimit_lines",
    "with_max_tokens",
]

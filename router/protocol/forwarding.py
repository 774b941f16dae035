"""Headers that do not cross the router: hop-by-hop ones (RFC 9110 7.6.1) and those it
writes itself. The request readers and `Exchange` build the forwarded request and the relayed
head with them."""

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-connection",
    }
)
# Expect: the router reads the whole body before it picks a replica, so it answers
# `100-continue` itself and the replica never sees the expectation.
NOT_FORWARDED = HOP_BY_HOP | {
    b"host",
    b"content-length",
    b"x-forwarded-for",
    b"x-request-id",
    b"expect",
}
# The request headers the router itself reads (routing, keys, affinity, forwarding, traces): a
# request keeps only these by name, the rest go on as lines.
READ_BY_ROUTER = frozenset(
    {
        b"authorization",
        b"connection",
        b"content-type",
        b"traceparent",
        b"x-forwarded-for",
        b"x-gpufleet-model",
        b"x-request-id",
        b"x-session-id",
    }
)
# A request with two keys is refused rather than served with either: which one a proxy or an
# engine behind it would take is not ours to guess (RFC 9110 5.3: Authorization is no list).
ONE_KEY = "more than one Authorization header: send one key"
# Each is a Request attribute of its own: `content-type` is `request.content_type`.
READ_FIELDS = {name: name.decode().replace("-", "_") for name in sorted(READ_BY_ROUTER)}


def headers_of(request) -> dict[bytes, bytes]:
    """The headers the router reads that a request has, by lower-case name, as a dict."""
    return {
        name: getattr(request, field)
        for name, field in READ_FIELDS.items()
        if getattr(request, field) is not None
    }


NOT_RELAYED = HOP_BY_HOP | {b"content-length", b"x-request-id"}
CHUNK_END = b"0\r\n\r\n"
# A replica's answer whose head (status line and headers) is larger is refused: a 502 for the
# client, or the next replica. Engines send a few hundred bytes; the router keeps the whole
# head in memory.
MAX_ANSWER_HEAD_BYTES = 64 * 1024
# Connection header values that name no other header: nothing more to drop.
CONNECTION_WITHOUT_NAMES = frozenset({b"keep-alive", b"close"})

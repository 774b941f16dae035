"""Headers that do not cross the router: hop-by-hop ones (RFC 9110 7.6.1) and those it
writes itself. `Exchange` builds the forwarded request and the relayed head with them."""

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
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"x-forwarded-for", b"x-request-id"}
NOT_RELAYED = HOP_BY_HOP | {b"content-length", b"x-request-id"}
CHUNK_END = b"0\r\n\r\n"
# Connection header values that name no other header: nothing more to drop.
CONNECTION_WITHOUT_NAMES = frozenset({b"keep-alive", b"close"})

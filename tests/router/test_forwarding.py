"""What the router sends upstream: the request unchanged except hop-by-hop headers, Host,
X-Forwarded-For and X-Request-Id."""

import asyncio

from router.path.context import ProxyConfig, ProxyContext
from router.path.exchange import Exchange
from router.path.fastpath import EndpointTable
from router.path.front import ClientConnection
from router.path.upstream import UpstreamPool


def forwarded(header_list, body=b'{"model":"m"}', peer=b"127.0.0.9", request_id=b"rid-1"):
    """What the replica gets for a request with these headers, parsed by the real front. The
    body goes with a content-length, or chunked when the headers say so."""

    async def through_the_front():
        ctx = ProxyContext(EndpointTable(), ProxyConfig(max_body_bytes=1 << 20))
        front = ClientConnection(ctx)
        raw = b"".join(b"%s: %s\r\n" % pair for pair in header_list)
        if (b"transfer-encoding", b"chunked") in header_list:
            framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        else:
            raw += b"content-length: %d\r\n" % len(body)
            framed = body
        front.reader.feed(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n%s\r\n%s" % (raw, framed))
        request = front.pending[0]
        front.peer = peer
        exchange = Exchange(front, ("m", False), request, request_id)
        pool = UpstreamPool("http://127.0.0.1:9000/base", connect_timeout=1)
        head, _, sent_body = exchange.request_bytes(pool).partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        return lines[0], [tuple(line.split(b": ", 1)) for line in lines[1:]], sent_body

    return asyncio.run(through_the_front())


def test_hop_by_hop_headers_go_and_proxy_headers_come():
    start, headers, body = forwarded(
        [
            (b"host", b"router.example"),
            (b"connection", b"keep-alive, x-secret"),
            (b"keep-alive", b"timeout=5"),
            (b"te", b"trailers"),
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer sk-1"),
            (b"x-secret", b"dropped"),
            (b"x-custom", b"kept"),
        ]
    )
    assert start == b"POST /base/v1/chat/completions?x=1 HTTP/1.1"
    assert headers == [
        (b"host", b"127.0.0.1:9000"),
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer sk-1"),
        (b"x-custom", b"kept"),
        (b"x-forwarded-for", b"127.0.0.9"),
        (b"x-request-id", b"rid-1"),
        (b"content-length", b"13"),
    ]
    assert body == b'{"model":"m"}'


def test_an_existing_forwarded_for_is_extended():
    _, headers, _ = forwarded([(b"x-forwarded-for", b"10.1.1.1")])
    assert (b"x-forwarded-for", b"10.1.1.1, 127.0.0.9") in headers


def test_a_chunked_request_goes_on_with_its_length():
    _, headers, body = forwarded([(b"transfer-encoding", b"chunked")], body=b'{"model":"m"}')
    assert [name for name, _ in headers] == [
        b"host",
        b"x-forwarded-for",
        b"x-request-id",
        b"content-length",
    ]
    assert (b"content-length", b"13") in headers and body == b'{"model":"m"}'

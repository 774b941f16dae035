"""The router's per-request Python cost without sockets: a request goes through the real
ClientConnection, Exchange and UpstreamConnection, with transports that only record writes.

    python -m bench.proxy_inprocess [--requests 20000] [--profile | --opcodes] [--affinity off]

What it measures is everything gpurouter does per request except the system calls, so it is
stable where a load test on a shared machine is not, and cProfile's view of it is not drowned
by the event loop.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import hashlib
import pstats
import sys
import time

from router.path.context import ProxyConfig, ProxyContext
from router.path.fastpath import EndpointTable
from router.path.front import ClientConnection
from router.path.upstream import UpstreamConnection

BODY = b'{"model": "m", "prompt": "hi", "max_tokens": 4}'
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: application/json\r\n"
    b"Content-Type: application/json\r\nUser-Agent: OpenAI/Python 1.0\r\n"
    b"Authorization: Bearer sk-none\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
ANSWER_BODY = (
    b'{"id":"cmpl-1","object":"text_completion","model":"m","choices":[],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: Mon, 30 Nov 2026 00:00:00 GMT"
    b"\r\nserver: uvicorn\r\ncontent-length: %d\r\n\r\n%s" % (len(ANSWER_BODY), ANSWER_BODY)
)


class RecordingTransport:
    def __init__(self) -> None:
        self.written = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 50000) if name == "peername" else default

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    resume_reading = pause_reading


# A tenant with every limit on and none reached, whose key the request carries (--tenant).
TENANT = {
    "tenants": {
        "bench": {
            "requests_per_minute": 10**8,
            "tokens_per_minute": 10**11,
            "max_in_flight": 10**5,
            "shares": {"": [10**8, 10**11, 10**5]},
        }
    },
    "keys": {hashlib.sha256(b"sk-none").hexdigest(): ["bench", "key-1"]},
}


def run(
    requests: int,
    affinity: str = "prefix",
    clock=time.perf_counter,
    tenant: bool = False,
    traces: float = 0.0,
) -> float:
    """Seconds per request through the proxy's Python code, on `clock` (time.thread_time: the
    CPU this thread spent, which time taken by other processes of a shared machine leaves out).
    `tenant`: the request's key is a tenant's, with its limits checked. `traces`: the share of
    requests traced (their spans kept by an exporter whose collector does not answer)."""

    async def body() -> float:
        table = EndpointTable()
        table.update({"m": [("r1", "http://127.0.0.1:9")]})
        ctx = ProxyContext(table, ProxyConfig(affinity=affinity))
        if tenant:
            ctx.tenants_changed(TENANT)
        if traces:
            from router.telemetry.tracing import Tracing

            ctx.tracing = Tracing("http://127.0.0.1:9/v1/traces", traces)
        pool = ctx.pool_for("http://127.0.0.1:9")
        upstream = UpstreamConnection(pool)
        upstream.connection_made(RecordingTransport())
        pool.open.add(upstream)
        pool.put_back(upstream)
        client = ClientConnection(ctx)
        client_transport = RecordingTransport()
        client.connection_made(client_transport)
        feed_client, feed_upstream = client.data_received, upstream.data_received
        t0 = clock()
        for _ in range(requests):
            feed_client(REQUEST)
            feed_upstream(ANSWER)
        elapsed = clock() - t0
        assert client_transport.written >= requests * len(ANSWER_BODY), "answers went missing"
        assert table.snapshot()["used"] == {"r1": 0.0} or table.in_flight(0) == 0
        return elapsed / requests

    import uvloop

    return uvloop.new_event_loop().run_until_complete(body())


def count_opcodes(fn) -> collections.Counter:
    counts: collections.Counter = collections.Counter()

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts[frame.f_code.co_qualname] += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--opcodes",
        action="store_true",
        help="count the bytecodes run per request (exact where timings are noisy)",
    )
    parser.add_argument(
        "--affinity",
        default="prefix",
        choices=["off", "session", "prefix"],
        help="the router's --affinity (off: least in flight, no key computed)",
    )
    parser.add_argument("--tenant", action="store_true", help="the key is a limited tenant's")
    args = parser.parse_args()
    if args.opcodes:
        run(50, args.affinity)  # warm up
        counts = count_opcodes(lambda: run(200, args.affinity))
        print(f"{sum(counts.values()) / 200:.0f} bytecodes per proxied request")
        for name, n in counts.most_common(12):
            print(f"{n / 200:8.1f}  {name}")
    elif args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run, args.requests, args.affinity, tenant=args.tenant)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    else:
        best = min(run(args.requests, args.affinity, tenant=args.tenant) for _ in range(5))
        print(f"{best * 1e6:.2f} µs of Python per proxied request")


if __name__ == "__main__":
    main()

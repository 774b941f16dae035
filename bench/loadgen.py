"""A small closed-loop HTTP/1.1 load generator: N keep-alive connections, bounded in time.

Each connection sends a request, reads the whole answer (Content-Length or chunked, so SSE
streams count to their last byte), records the latency and sends the next. For a chunked
answer it also records the longest gap between two chunks of it (from the head to the first
chunk, and between chunks): a stream that stalls midway shows there even when its total time
does not stand out. Run it in its own process (`python -m bench.loadgen URL ...`) so that it
does not share a core's event loop with what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from urllib.parse import urlsplit


def build_request(url: str, body: bytes, headers: tuple[str, ...] = ()) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    extra = "".join(f"{header}\r\n" for header in headers)
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return parts.hostname, parts.port, head.encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, float]:
    """(status, the longest wait for one chunk in seconds; 0 for a body of known length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    lower = head.lower()
    if b"content-length:" in lower:
        length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await reader.readexactly(length)
        return status, 0.0
    longest = 0.0
    last = time.perf_counter()
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        await reader.readexactly(size + 2)
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
        if size == 0:
            return status, longest


async def connection(host, port, request, deadline, latencies, gaps, errors) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            writer.write(request)
            status, gap = await read_answer(reader)
            if status != 200:
                errors.append(status)
            latencies.append(time.perf_counter() - t0)
            gaps.append(gap)
    finally:
        writer.close()


def quantiles(values: list[float], prefix: str) -> dict:
    """p50, p99 and p99.9 of `values` (seconds) in ms, as `{prefix}p50_ms`..."""
    ranked = sorted(values)

    def at(q):
        return ranked[min(len(ranked) - 1, int(q * len(ranked)))] * 1e3 if ranked else 0.0

    return {f"{prefix}p50_ms": at(0.5), f"{prefix}p99_ms": at(0.99), f"{prefix}p999_ms": at(0.999)}


async def run(
    url: str, body: bytes, connections: int, seconds: float, warmup: float, headers=()
) -> dict:
    host, port, request = build_request(url, body, headers)
    if warmup:
        await asyncio.gather(
            *(
                connection(host, port, request, time.perf_counter() + warmup, [], [], [])
                for _ in range(connections)
            )
        )
    latencies: list[float] = []
    gaps: list[float] = []
    errors: list[int] = []
    start = time.perf_counter()
    await asyncio.gather(
        *(
            connection(host, port, request, start + seconds, latencies, gaps, errors)
            for _ in range(connections)
        )
    )
    elapsed = time.perf_counter() - start
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        **quantiles(latencies, ""),
        **quantiles(gaps, "gap_"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--body", default='{"model": "m", "max_tokens": 4}')
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument(
        "--header", action="append", default=[], help="NAME: VALUE, sent with each request"
    )
    args = parser.parse_args()
    import uvloop

    result = uvloop.run(
        run(
            args.url,
            args.body.encode(),
            args.connections,
            args.seconds,
            args.warmup,
            tuple(args.header),
        )
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

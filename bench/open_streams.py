"""Hold many streaming requests open at once, for measuring a proxy's memory per open stream.

    python -m bench.open_streams URL --streams 10000 --hold 10

Opens the streams (a few hundred connections at a time), waits until each has received its
answer's head and first event, prints `open N` (N: how many made it) and holds them all for
`--hold` seconds while the caller measures, reading their events; then prints `gaps` and a
JSON object of the longest wait between two events of a stream (p50, p99, p99.9 and max over
streams, in ms), closes them and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urlsplit

BODY = b'{"model": "m", "prompt": "hi", "max_tokens": 600, "stream": true}'
OPENING_AT_ONCE = 200


async def open_stream(host: str, port: int, request: bytes, gate: asyncio.Semaphore):
    async with gate:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"\n\n")  # the first event
    return reader, writer


async def longest_gap(reader: asyncio.StreamReader, until: float) -> float:
    """The longest wait for one event of this stream until `until` (perf_counter)."""
    longest, last = 0.0, time.perf_counter()
    while (left := until - time.perf_counter()) > 0:
        try:
            await asyncio.wait_for(reader.readuntil(b"\n\n"), left)
        except (TimeoutError, asyncio.IncompleteReadError):
            break
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return max(longest, min(time.perf_counter(), until) - last)


def quantiles_ms(values: list[float]) -> dict:
    ranked = sorted(values) or [0.0]

    def at(q):
        return round(ranked[min(len(ranked) - 1, int(q * len(ranked)))] * 1e3, 1)

    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "p999_ms": at(0.999), "max_ms": at(1.0)}


async def main(url: str, streams: int, hold_s: float) -> int:
    parts = urlsplit(url)
    request = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    gate = asyncio.Semaphore(OPENING_AT_ONCE)
    opened = await asyncio.gather(
        *(open_stream(parts.hostname, parts.port, request, gate) for _ in range(streams)),
        return_exceptions=True,
    )
    pairs = [pair for pair in opened if isinstance(pair, tuple)]
    writers = [writer for _, writer in pairs]
    print(f"open {len(writers)}", flush=True)
    until = time.perf_counter() + hold_s
    gaps = await asyncio.gather(*(longest_gap(reader, until) for reader, _ in pairs))
    print("gaps " + json.dumps(quantiles_ms(gaps)), flush=True)
    for writer in writers:
        writer.close()
    return 0 if len(writers) == streams else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--hold", type=float, default=10.0)
    args = parser.parse_args()
    import uvloop

    sys.exit(uvloop.run(main(args.url, args.streams, args.hold)))

"""Hold many streaming requests open at once, for measuring a proxy's memory per open stream.

    python -m bench.open_streams URL --streams 10000 --hold 10

Opens the streams (a few hundred connections at a time), waits until each has received its
answer's head and first event, prints `open N` (N: how many made it) and holds them all for
`--hold` seconds while the caller measures, then closes them and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from urllib.parse import urlsplit

BODY = b'{"model": "m", "prompt": "hi", "max_tokens": 600, "stream": true}'
OPENING_AT_ONCE = 200


async def open_stream(host: str, port: int, request: bytes, gate: asyncio.Semaphore):
    async with gate:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"\n\n")  # the first event
    return writer


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
    writers = [w for w in opened if isinstance(w, asyncio.StreamWriter)]
    print(f"open {len(writers)}", flush=True)
    await asyncio.sleep(hold_s)
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

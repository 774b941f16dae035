"""A fixed-answer HTTP/1.1 upstream on uvloop: fast enough that a proxy in front of it, not
the upstream, is what a load test measures. For benchmarks only:

    python -m bench.fixed_upstream PORT                      # a small JSON answer
    python -m bench.fixed_upstream PORT --sse 64             # 64 SSE events, one write each
    python -m bench.fixed_upstream PORT --sse 600 --every 1  # one event a second: open streams
"""

import argparse
import asyncio

BODY = (
    b'{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,'
    b'"text":"ok","finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
EVENT = b'data: {"choices":[{"index":0,"text":"tok"}]}\n\n'
CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
LAST = b"%x\r\n%s\r\n0\r\n\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")


class Fixed(asyncio.Protocol):
    sse_events = 0  # 0: the JSON answer
    every_s = 0.0  # between events; 0: all at once, each in its own write

    def connection_made(self, transport):
        self.transport = transport
        self.buffer = b""
        self.timer = None

    def connection_lost(self, exc):
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data):
        # Requests from the load tests are small and carry Content-Length; answer each one.
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            if b"content-length:" in head:
                length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.answer()

    def answer(self):
        if not self.sse_events:
            self.transport.write(ANSWER)
            return
        self.transport.write(SSE_HEAD)
        if not self.every_s:
            for _ in range(self.sse_events):
                self.transport.write(CHUNK)
            self.transport.write(LAST)
            return
        self.slow_event(self.sse_events)

    def slow_event(self, left: int) -> None:
        if self.transport.is_closing():
            return
        if left == 0:
            self.transport.write(LAST)
            return
        self.transport.write(CHUNK)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.every_s, self.slow_event, left - 1)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Fixed, "127.0.0.1", port, backlog=4096)
    await server.serve_forever()


if __name__ == "__main__":
    import uvloop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--sse", type=int, default=0, help="answer with this many SSE events")
    parser.add_argument("--every", type=float, default=0.0, help="seconds between events")
    args = parser.parse_args()
    Fixed.sse_events, Fixed.every_s = args.sse, args.every
    uvloop.run(serve(args.port))

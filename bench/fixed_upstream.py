"""A fixed-answer HTTP/1.1 upstream on uvloop: fast enough that a proxy in front of it, not
the upstream, is what a load test measures. For benchmarks only (`python -m bench.fixed_upstream
PORT`)."""

import asyncio
import sys

BODY = (
    b'{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,'
    b'"text":"ok","finish_reason":"length"}]}'
)
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


class Fixed(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buffer = b""

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
            self.transport.write(ANSWER)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Fixed, "127.0.0.1", port, backlog=1024)
    await server.serve_forever()


if __name__ == "__main__":
    import uvloop

    uvloop.run(serve(int(sys.argv[1])))

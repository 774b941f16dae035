"""The ceiling of any router built on uvloop's Python protocols: a TCP relay that parses
nothing. Each client connection gets its own connection to the backend, and every read goes
to the peer as one write, so a request costs two protocol callbacks and two writes.

    python -m bench.tcp_relay LISTEN_PORT BACKEND_PORT

`bench/compare_routers.py --with-relay` runs it beside gpurouter and nginx: what gpurouter
does beyond it is the cost of being an HTTP router; what it cannot do is the cost of
uvloop and Python protocols themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvloop


class Side(asyncio.Protocol):
    """One end of a relayed pair; what it reads, its peer writes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Side | None = None
        self.early: list[bytes] = []  # read before the peer connected

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.early.append(data)

    def connection_lost(self, exc) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


def client_side(loop, backend_port: int) -> Side:
    client = Side()

    async def connect() -> None:
        try:
            _, upstream = await loop.create_connection(Side, "127.0.0.1", backend_port)
        except OSError:
            client.transport.close()
            return
        client.peer, upstream.peer = upstream, client
        for data in client.early:
            upstream.transport.write(data)
        client.early.clear()

    loop.create_task(connect())
    return client


async def serve(port: int, backend_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: client_side(loop, backend_port), "127.0.0.1", port, backlog=1024
    )
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("backend_port", type=int)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.backend_port))


if __name__ == "__main__":
    main()

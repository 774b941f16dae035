"""A replica that ends its answer by closing the connection (no length, no chunks)."""

import asyncio

import pytest

from tests.harness import post
from tests.router.fake_upstreams import serving

pytestmark = pytest.mark.integration


class AnswersUntilClose(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if b"\r\n\r\n" in data:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b'connection: close\r\n\r\n{"part": 1'
            )
            self.transport.write(b', "part2": 2}')
            self.transport.close()


def test_a_close_delimited_answer_is_relayed_whole(procs):
    with serving(AnswersUntilClose) as upstream:
        router, _ = procs.router(f"--backend=m={upstream}")
        for _ in range(3):
            status, headers, body = post(router + "/v1/completions", b'{"model": "m"}')
            assert (status, body) == (200, b'{"part": 1, "part2": 2}')
            assert headers["Transfer-Encoding"] == "chunked"

"""`Expect: 100-continue`: the router, which reads the whole body before it picks a replica,
asks for the body itself and does not pass the expectation on."""

import json
import socket

import pytest

pytestmark = pytest.mark.integration

BODY = b'{"model": "m", "prompt": "hi", "max_tokens": 2}'


def connect_to_a_router(procs) -> socket.socket:
    router, _ = procs.router(f"--backend=m={procs.engine('m')}")
    return socket.create_connection(("127.0.0.1", int(router.rsplit(":", 1)[1])), timeout=10)


def test_a_client_that_expects_100_continue_gets_it_then_its_answer(procs):
    with connect_to_a_router(procs) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(BODY)
        )
        # A client waits for the interim answer before it sends the body (curl: up to 1 s).
        interim = sock.recv(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(BODY)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            part = sock.recv(65536)
            assert part, answer
            answer += part
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert json.loads(body)["object"] == "text_completion"


def test_an_interim_answer_from_the_replica_is_not_taken_for_the_answer(procs):
    """A client that sent its body without waiting: the replica's own 100 Continue, had the
    expectation reached it, would not be relayed as the answer."""
    with connect_to_a_router(procs) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
        )
        answer = b""
        while not answer.endswith(b"}"):
            part = sock.recv(65536)
            assert part, answer
            answer += part
    assert b"100 Continue" not in answer
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and json.loads(body)["choices"]

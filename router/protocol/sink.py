"""What a response reader (router.protocol.wire) tells of the answers it reads: the side an upstream
connection takes. A base class rather than a protocol so that, compiled, the reader's calls
are C calls; typed in sink.pxd."""

from __future__ import annotations


class AnswerSink:
    def answer_head(self, status: int) -> None:
        """The answer's head is read: the reader's `length_given` and `sse` tell of it, and
        its `relay_head()` sends the client its head."""
        raise NotImplementedError

    def answer_body(self, data: bytes) -> None:
        """All of the body one read brought, framed as the client is to get it."""
        raise NotImplementedError

    def answer_complete(self, keep_alive: bool) -> None:
        raise NotImplementedError

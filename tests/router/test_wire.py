"""The request readers: llhttp's C callbacks (router.protocol._wire) and its httptools twin
(router.protocol.wire_py) read the same requests the same way, and refuse the same ones with the
same status, however the bytes are split across reads."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from router.protocol import _wire, wire_py
from router.protocol.errors import InvalidResponse, RequestRefused
from router.protocol.forwarding import MAX_ANSWER_HEAD_BYTES
from router.protocol.sink import AnswerSink

READERS = [_wire.RequestReader, wire_py.RequestReader]
MAX_HEADER_BYTES, MAX_BODY_BYTES = 4096, 1000


def read(reader_class, *pieces: bytes):
    """The requests read from these pieces, as plain tuples, and the refusal if any."""
    pending: list = []
    reader = reader_class(pending, MAX_HEADER_BYTES, MAX_BODY_BYTES)
    refusal = None
    try:
        for piece in pieces:
            reader.feed(piece)
    except RequestRefused as exc:
        refusal = (exc.status, str(exc))
    requests = [
        (r.method, r.url, r.path, r.headers, r.forward, r.body, r.keep_alive) for r in pending
    ]
    return requests, refusal, reader.mid_message


@pytest.mark.parametrize("reader_class", READERS)
@pytest.mark.parametrize(
    ("target", "path"),
    [(b"/v1/models", b"/v1/models"), (b"/v1/x?", b"/v1/x"), (b"/a?b?c", b"/a"), (b"/?q", b"/")],
)
def test_the_path_is_the_target_without_its_query(reader_class, target, path):
    [request], refusal, _ = read(reader_class, b"GET %s HTTP/1.1\r\nHost: h\r\n\r\n" % target)
    assert refusal is None
    assert request[1:3] == (target, path)


@pytest.mark.parametrize("module", [_wire, wire_py])
def test_numbered_writes_the_prefix_then_the_number(module):
    assert module.numbered(b"ab-", 0) == b"ab-0"
    assert module.numbered(b"", 1234567890123) == b"1234567890123"
    with pytest.raises(ValueError):
        module.numbered(b"x", -1)


@given(st.integers(0, 2**63 - 1))
def test_numbered_writes_any_number_in_decimal(number):
    assert _wire.numbered(b"id-", number) == b"id-%d" % number


@pytest.mark.parametrize("module", [_wire, wire_py])
def test_number_after_reads_the_last_count_of_a_name(module):
    tail = b'{"usage":{"prompt_tokens":1}}\ndata: {"usage": {"prompt_tokens" :\t12, "x": 3}}'
    assert module.number_after(tail, b'"prompt_tokens"') == 12
    assert module.number_after(b'{"max_tokens":999999999999}', b'"max_tokens"') == 999999999999
    for refused in (b'{"max_tokens":9999999999999}', b'{"max_tokens":"5"}', b'{"max_tokens"}',
                    b'{"max_tokens":}', b'{"max_tokens', b""):  # fmt: skip
        assert module.number_after(refused, b'"max_tokens"') == -1
    assert module.number_after(b"abc", b"") == module.number_after(b"a:1", b"a") == -1


@given(st.binary(max_size=60), st.sampled_from([b'"n"', b"n", b'"max_tokens"']))
@example(b'"n": 0012', b'"n"')
def test_number_after_is_the_same_compiled_and_not(data, name):
    assert _wire.number_after(data, name) == wire_py.number_after(data, name)


@given(st.text('0123456789 :\t\n"n', max_size=40))
def test_number_after_is_the_same_on_json_like_text(text):
    data = text.encode()
    assert _wire.number_after(data, b'"n"') == wire_py.number_after(data, b'"n"')


@pytest.mark.parametrize("module", [_wire, wire_py])
def test_ratelimit_lines_are_openais_headers(module):
    prefix = b"x-ratelimit-limit-requests: 60\r\nx-ratelimit-remaining-requests: "
    lines = module.ratelimit_lines(prefix, 59, 1000, b"", 5, 5)
    assert lines == (
        b"x-ratelimit-limit-requests: 60\r\nx-ratelimit-remaining-requests: 59\r\n"
        b"x-ratelimit-reset-requests: 1s\r\n"
    )
    both = module.ratelimit_lines(b"R: ", -3, 360_500, b"T: ", 7, 250)
    assert both == (
        b"R: 0\r\nx-ratelimit-reset-requests: 6m1s\r\nT: 7\r\nx-ratelimit-reset-tokens: 250ms\r\n"
    )
    assert module.ratelimit_lines(b"", 1, 1, b"", 1, 1) == b""


@given(st.integers(-10, 10**15), st.integers(-10, 10**9), st.integers(-10, 10**15),
       st.integers(-10, 10**9), st.booleans(), st.booleans())  # fmt: skip
def test_ratelimit_lines_are_the_same_compiled_and_not(left, reset, tokens, tokens_reset, r, t):
    prefixes = (b"x-ratelimit-limit-requests: 9\r\nrem: " if r else b"", b"tok: " if t else b"")
    arguments = (prefixes[0], left, reset, prefixes[1], tokens, tokens_reset)
    assert _wire.ratelimit_lines(*arguments) == wire_py.ratelimit_lines(*arguments)


@given(st.one_of(st.none(), st.integers(0, 2**33)), st.one_of(st.none(), st.integers(0, 2**33)),
       st.sampled_from([b"", b" ", b',"total_tokens":7']), st.booleans())  # fmt: skip
def test_usage_is_read_the_same_compiled_and_not(prompt, completion, between, details):
    fields = []
    if prompt is not None:
        fields.append(b'"prompt_tokens":%d' % prompt)
    if details:
        fields.append(b'"prompt_tokens_details":{"cached_tokens":3}')
    if completion is not None:
        fields.append(b'"completion_tokens":' + between.strip(b",") + b"%d" % completion)
    tail = b'{"id":"x","usage":{' + b",".join(fields) + b"}}"
    expected = -1
    if prompt is not None and completion is not None and prompt < 2**31 and completion < 2**31:
        expected = -1 if between.startswith(b",") else prompt << 32 | completion
    assert _wire.usage_tokens(tail) == wire_py.usage_tokens(tail) == expected, tail


@pytest.mark.parametrize("module", [_wire, wire_py])
def test_the_clock_is_time_monotonic(module):
    import time

    before = time.monotonic()
    now = module.monotonic()
    assert before <= now <= time.monotonic()


REQUEST = (
    b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
    b"X-Empty:\r\nConnection: keep-alive, x-secret\r\nX-Secret: s\r\nAuthorization: Bearer k\r\n"
    b'Te: trailers\r\nX-Request-Id: rid\r\nContent-Length: 13\r\n\r\n{"model":"m"}'
)


@pytest.mark.parametrize("reader_class", READERS)
def test_a_request_is_read_whole_with_lower_case_names(reader_class):
    [request], refusal, mid = read(reader_class, REQUEST)
    assert refusal is None and not mid
    method, url, path, headers, forward, body, keep_alive = request
    assert (method, url, path, body, keep_alive) == (
        b"POST",
        b"/v1/chat/completions?x=1",
        b"/v1/chat/completions",
        b'{"model":"m"}',
        True,
    )
    # Only the headers the router reads are kept by name...
    assert headers == {
        b"content-type": b"application/json",
        b"connection": b"keep-alive, x-secret",
        b"authorization": b"Bearer k",
        b"x-request-id": b"rid",
    }
    # ...and every header but the hop-by-hop ones and those the router writes goes on.
    assert forward == (
        b"content-type: application/json\r\nx-empty: \r\nx-secret: s\r\nauthorization: Bearer k\r\n"
    )


@pytest.mark.parametrize("reader_class", READERS)
def test_a_traceparent_is_kept_by_name_and_goes_on_as_a_line(reader_class):
    """The tracer reads the field; the engine gets the header unless the request is traced."""
    data = (
        b"POST /v1/completions HTTP/1.1\r\nX-Traceparent: no\r\nTraceparent: 00-ab-cd-01\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    pending: list = []
    reader_class(pending, MAX_HEADER_BYTES, MAX_BODY_BYTES).feed(data)
    [request] = pending
    assert request.traceparent == b"00-ab-cd-01"
    assert request.forward == b"x-traceparent: no\r\ntraceparent: 00-ab-cd-01\r\n"
    pending.clear()
    reader_class(pending, MAX_HEADER_BYTES, MAX_BODY_BYTES).feed(REQUEST)
    assert pending[0].traceparent is None


@pytest.mark.parametrize("reader_class", READERS)
def test_any_split_reads_the_same(reader_class):
    whole = read(reader_class, REQUEST)
    for at in range(1, len(REQUEST)):
        assert read(reader_class, REQUEST[:at], REQUEST[at:]) == whole, at
    assert read(reader_class, *[REQUEST[i : i + 1] for i in range(len(REQUEST))]) == whole


@pytest.mark.parametrize("reader_class", READERS)
def test_pipelined_requests_are_read_in_order_and_a_partial_one_is_mid_message(reader_class):
    first = b"GET /healthz HTTP/1.1\r\nhost: a\r\n\r\n"
    second = b"POST /v1/x HTTP/1.1\r\ncontent-length: 2\r\n\r\nok"
    requests, refusal, mid = read(reader_class, first + second + b"GET / HT")
    assert refusal is None and mid
    assert [(r[0], r[1], r[5], r[6]) for r in requests] == [
        (b"GET", b"/healthz", b"", True),
        (b"POST", b"/v1/x", b"ok", True),
    ]


@pytest.mark.parametrize("reader_class", READERS)
@pytest.mark.parametrize(
    "data",
    [b"GET / HTTP/1.0\r\n\r\n", b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n"],
)
def test_a_request_that_closes_its_connection_is_not_kept_alive(reader_class, data):
    [request], refusal, _ = read(reader_class, data + b"GET / HTTP/1.1\r\n\r\n")
    assert request[6] is False
    assert refusal[0] == 400  # nothing may follow it


@pytest.mark.parametrize("reader_class", READERS)
def test_a_chunked_body_is_read_whole(reader_class):
    data = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    [request], refusal, _ = read(reader_class, data)
    assert refusal is None and request[5] == b"abcde" and request[4] == b""


REFUSED = [
    (b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nx", 400),  # smuggling
    (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", 400),  # bad chunk size
    (b"\x00\x01 not http at all\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nauthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nx-big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n", 431),
    (b"GET /" + b"a" * MAX_HEADER_BYTES + b" HTTP/1.1\r\n\r\n", 431),
    (b"POST / HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1), 413),
    (b"POST / HTTP/1.1\r\ncontent-length: 99999999999999999999999\r\n\r\n", 400),  # overflow
    (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n" % 2000 + b"a" * 2000, 413),
]


@pytest.mark.parametrize("reader_class", READERS)
@pytest.mark.parametrize("data, status", REFUSED)
def test_what_is_refused_and_with_which_status(reader_class, data, status):
    _, refusal, _ = read(reader_class, data)
    assert refusal is not None and refusal[0] == status


def test_both_readers_give_the_same_reasons():
    for data, _ in REFUSED:
        assert read(_wire.RequestReader, data) == read(wire_py.RequestReader, data)


def test_a_reader_that_refused_keeps_the_requests_it_had_read():
    good = b"GET /a HTTP/1.1\r\n\r\n"
    for reader_class in READERS:
        requests, refusal, _ = read(reader_class, good + b"\x00bad\r\n\r\n")
        assert refusal[0] == 400 and [r[1] for r in requests] == [b"/a"]


token = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-",
    min_size=1,
    max_size=12,
)
header_name = st.one_of(
    token,
    st.sampled_from(
        [
            "Content-Type",
            "Connection",
            "X-Request-Id",
            "Host",
            "Te",
            "Keep-Alive",
            "Authorization",
            "X-Session-Id",
            "X-Forwarded-For",
            "X-Gpufleet-Model",
            "Traceparent",
            "Upgrade",
        ]
    ),
)
header_value = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ,;=/-", max_size=30).map(
    str.strip
)
requests = st.lists(
    st.tuples(
        st.sampled_from([b"GET", b"POST", b"DELETE", b"PUT"]),
        st.text(alphabet="abc/?=&123", max_size=20).map(lambda p: ("/" + p).encode()),
        st.lists(st.tuples(header_name, header_value), max_size=8),
        st.one_of(st.none(), st.binary(max_size=40)),
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
)


def framed_body(lines: list[bytes], body: bytes | None, chunked: bool) -> bytes:
    """The head's lines and the body after them, framed by length or in one chunk."""
    framed = b""
    if body is not None and chunked:
        lines.append(b"Transfer-Encoding: chunked")
        framed = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    elif body is not None:
        lines.append(b"Content-Length: %d" % len(body))
        framed = body
    return b"\r\n".join(lines) + b"\r\n\r\n" + framed


def encode(method, path, headers, body, chunked) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (method, path)]
    lines += [b"%s: %s" % (n.encode(), v.encode()) for n, v in headers]
    return framed_body(lines, body, chunked)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(requests, st.lists(st.integers(0, 400), max_size=4))
def test_the_reader_and_its_twin_agree(batch, cuts):
    pieces = split(b"".join(encode(*request) for request in batch), cuts)
    assert read(_wire.RequestReader, *pieces) == read(wire_py.RequestReader, *pieces)


def dechunk(data: bytes) -> tuple[bytes, bool]:
    """The content of chunks framed as a relayed answer's are, and whether the last chunk
    ended them: strictly, or the test fails."""
    content = b""
    while data:
        size_line, crlf, data = data.partition(b"\r\n")
        assert crlf and size_line and size_line == b"%x" % int(size_line, 16), size_line
        size = int(size_line, 16)
        if size == 0:
            assert data == b"\r\n", data
            return content, True
        assert data[size : size + 2] == b"\r\n", data
        content, data = content + data[:size], data[size + 2 :]
    return content, False


class Sink(AnswerSink):
    """Records what a response reader tells its connection: the head the client gets, and
    the body as its content, unframed (where reads split it decides where the relayed chunks
    are cut)."""

    def __init__(self) -> None:
        self.events: list = []
        self.reader = None
        self.reads_with_body = 0
        self.head_to_come = False

    def answer_head(self, status):
        reader = self.reader
        self.events.append(("head", status, reader.length_given, reader.sse))
        reader.relay_head(b"rid", status >= 500)
        self.head_to_come = True

    def answer_body(self, data):
        self.reads_with_body += 1
        if self.head_to_come:  # first, whole, in the read that ended the head
            head, end, data = data.partition(b"\r\n\r\n")
            assert end, data
            self.events.append(("client head", head + end))
            self.head_to_come = False
        ended = False
        if not self.reader.length_given:
            data, ended = dechunk(data)
        if data and self.events[-1][0] == "body":
            self.events[-1] = ("body", self.events[-1][1] + data)
        elif data:
            self.events.append(("body", data))
        if ended:
            self.events.append(("last chunk",))

    def answer_complete(self, keep_alive):
        self.events.append(("complete", keep_alive))


RESPONSE_READERS = [_wire.ResponseReader, wire_py.ResponseReader]


def read_answers(reader_class, *pieces: bytes):
    sink = Sink()
    reader = sink.reader = reader_class(sink)
    error = None
    try:
        for piece in pieces:
            reader.feed(piece)
    except InvalidResponse as exc:
        error = str(exc)
    assert sink.reads_with_body <= len(pieces) + 3  # once per read, and once at each end
    return sink.events, error, reader.headers_done, reader.framed


ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nX-Request-Id: theirs\r\n"
    b"Connection: keep-alive\r\nServer: engine\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\ndata:\r\n3\r\n 1\n\r\n0\r\n\r\n"
    b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nKeep-Alive: timeout=5\r\n\r\nno"
)


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_an_answer_head_keeps_what_is_relayed_and_says_how_it_is_framed(reader_class):
    events, error, _, _ = read_answers(reader_class, ANSWER)
    assert error is None
    assert events == [
        ("head", 200, False, True),
        (
            "client head",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            b"Server: engine\r\ntransfer-encoding: chunked\r\nx-request-id: rid\r\n\r\n",
        ),
        ("body", b"data: 1\n"),
        ("last chunk",),
        ("complete", True),
        ("head", 404, True, False),
        (
            "client head",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nx-request-id: rid\r\n\r\n",
        ),
        ("body", b"no"),
        ("complete", True),
    ]


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_a_client_head_without_a_reason_gets_the_usual_one_and_can_close(reader_class):
    events, error, _, _ = read_answers(
        reader_class, b"HTTP/1.1 503 \r\ncontent-length: 0\r\nretry-after: 1\r\n\r\n"
    )
    assert error is None
    assert events[1] == (
        "client head",
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nretry-after: 1\r\n"
        b"connection: close\r\nx-request-id: rid\r\n\r\n",
    )


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_any_split_of_answers_reads_the_same(reader_class):
    whole = read_answers(reader_class, ANSWER)
    for at in range(1, len(ANSWER)):
        assert read_answers(reader_class, ANSWER[:at], ANSWER[at:]) == whole, at


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_a_read_of_many_chunks_is_passed_on_at_once_as_the_client_gets_it(reader_class):
    relayed = []
    sink = Sink()
    sink.answer_body = relayed.append
    reader = sink.reader = reader_class(sink)
    reader.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    reader.feed(b"1a\r\n" + b"a" * 26 + b"\r\n2\r\nbc\r\n")
    reader.feed(b"1000\r\n" + b"d" * 4096 + b"\r\n0\r\n\r\n")
    assert relayed == [
        # A read of the head alone: the client gets the head at once (an SSE stream's head
        # comes before its first event).
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-request-id: rid\r\n\r\n",
        b"1a\r\n" + b"a" * 26 + b"\r\n2\r\nbc\r\n",
        b"1000\r\n" + b"d" * 4096 + b"\r\n0\r\n\r\n",
    ]
    assert sink.events[-1] == ("complete", True)


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_an_answer_without_length_or_chunks_is_unframed(reader_class):
    events, error, headers_done, framed = read_answers(
        reader_class, b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart"
    )
    assert error is None and headers_done and not framed
    # Relayed in chunks of its own; the rest comes until the replica closes.
    assert events[-1] == ("body", b"part")


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_the_close_ends_an_unframed_answer_and_nothing_else(reader_class):
    sink = Sink()
    reader = sink.reader = reader_class(sink)
    reader.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart")
    assert reader.feed_eof()
    assert sink.events[-3:] == [("body", b"part"), ("last chunk",), ("complete", False)]
    assert not reader.feed_eof()  # told once
    assert len(sink.events) == 5
    framed = Sink()
    reader = framed.reader = reader_class(framed)
    reader.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\npart")
    assert not reader.feed_eof()  # cut short: the connection's loss tells the exchange
    assert framed.events[-1] == ("body", b"part")


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_what_is_not_an_answer_is_invalid(reader_class):
    for data in (b"SSH-2.0-OpenSSH\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"):
        _, error, _, _ = read_answers(reader_class, data)
        assert error


def test_a_sink_that_fails_makes_the_answer_invalid():
    class Failing(Sink):
        def answer_body(self, data):
            raise RuntimeError("bug")

    for reader_class in RESPONSE_READERS:
        sink = Failing()
        reader = sink.reader = reader_class(sink)
        with pytest.raises(InvalidResponse) as raised:
            reader.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx")
        assert isinstance(raised.value.__cause__, RuntimeError)


answers = st.lists(
    st.tuples(
        st.sampled_from([200, 201, 404, 500, 503]),
        st.lists(st.tuples(header_name, header_value), max_size=6),
        st.binary(max_size=40),
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
)


def encode_answer(status, headers, body, chunked) -> bytes:
    lines = [b"HTTP/1.1 %d Reason" % status]
    lines += [b"%s: %s" % (n.encode(), v.encode()) for n, v in headers]
    return framed_body(lines, body, chunked)


@settings(max_examples=300, deadline=None)
@given(answers, st.lists(st.integers(0, 400), max_size=4))
def test_the_response_reader_and_its_twin_agree(batch, cuts):
    pieces = split(b"".join(encode_answer(*answer) for answer in batch), cuts)
    assert read_answers(_wire.ResponseReader, *pieces) == read_answers(
        wire_py.ResponseReader, *pieces
    )


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=3))
# Found by this test: an empty read after an answer without length became an empty chunk, the
# end of the relayed answer, in the httptools twin.
@example(b"\r\n\x00", [3])
def test_any_bytes_get_the_same_answer_from_both_readers(data, cuts):
    """Garbage, truncations and near-misses: the C readers neither crash nor differ."""
    pieces = split(data, cuts)
    for prefix in (b"", b"POST /v1/x HTTP/1.1\r\n", b"HTTP/1.1 200 OK\r\n"):
        framed = [prefix + pieces[0], *pieces[1:]]
        assert read(_wire.RequestReader, *framed) == read(wire_py.RequestReader, *framed)
        assert read_answers(_wire.ResponseReader, *framed) == read_answers(
            wire_py.ResponseReader, *framed
        )


@pytest.mark.parametrize("reader_class", READERS)
def test_a_request_that_expects_100_continue_says_so_until_its_body_is_read(reader_class):
    pending: list = []
    reader = reader_class(pending, MAX_HEADER_BYTES, MAX_BODY_BYTES)
    reader.feed(b"POST / HTTP/1.1\r\nExpect: 100-Continue\r\ncontent-length: 2\r\n\r\n")
    assert reader.continue_wanted and reader.mid_message
    reader.feed(b"ok")
    assert not reader.continue_wanted and pending[0].body == b"ok"
    assert b"expect" not in pending[0].forward  # the replica never sees the expectation
    # HTTP/1.0 cannot take an interim answer; other expectations are not 100-continue.
    for head in (b"POST / HTTP/1.0\r\nexpect: 100-continue", b"POST / HTTP/1.1\r\nexpect: x"):
        reader = reader_class([], MAX_HEADER_BYTES, MAX_BODY_BYTES)
        reader.feed(head + b"\r\ncontent-length: 2\r\n\r\n")
        assert not reader.continue_wanted


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_interim_answers_are_dropped_and_the_answer_that_follows_is_read(reader_class):
    events, error, _, _ = read_answers(
        reader_class,
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    )
    assert error is None
    assert events == [
        ("head", 200, True, False),
        ("client head", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-request-id: rid\r\n\r\n"),
        ("body", b"ok"),
        ("complete", True),
    ]


def test_both_requests_build_the_same_upstream_request():
    data = (
        b"POST /v1/x?y=1 HTTP/1.1\r\nX-Forwarded-For: 10.0.0.1\r\nA: b\r\n"
        b"content-length: 3\r\n\r\nabc"
        b"GET /v1/y HTTP/1.1\r\n\r\n"
    )
    built = []
    for reader_class in READERS:
        pending: list = []
        reader_class(pending, MAX_HEADER_BYTES, MAX_BODY_BYTES).feed(data)
        built.append(
            [r.upstream(b"/base", b"h:1", r.forward, b"127.0.0.9", b"rid") for r in pending]
        )
    assert (
        built[0]
        == built[1]
        == [
            b"POST /base/v1/x?y=1 HTTP/1.1\r\nhost: h:1\r\na: b\r\n"
            b"x-forwarded-for: 10.0.0.1, 127.0.0.9\r\nx-request-id: rid\r\n"
            b"content-length: 3\r\n\r\nabc",
            b"GET /base/v1/y HTTP/1.1\r\nhost: h:1\r\nx-forwarded-for: 127.0.0.9\r\n"
            b"x-request-id: rid\r\ncontent-length: 0\r\n\r\n",
        ]
    )
    with pytest.raises(TypeError):
        pending[0].upstream(b"", b"h", b"", b"p", None)


def test_an_empty_forwarded_for_is_replaced_by_the_peer():
    for reader_class in READERS:
        pending: list = []
        reader_class(pending, MAX_HEADER_BYTES, MAX_BODY_BYTES).feed(
            b"GET / HTTP/1.1\r\nx-forwarded-for:\r\n\r\n"
        )
        sent = pending[0].upstream(b"", b"h", b"", b"127.0.0.9", b"rid")
        assert b"\r\nx-forwarded-for: 127.0.0.9\r\n" in sent, sent


@pytest.mark.parametrize("reader_class", RESPONSE_READERS)
def test_an_answer_head_over_the_limit_is_refused_and_one_under_it_is_not(reader_class):
    def answer_with_header_of(size: int) -> bytes:
        # What counts: the reason ("OK"), then each header's name and value.
        value = b"v" * (size - len(b"OK") - len(b"x-big"))
        return b"HTTP/1.1 200 OK\r\nx-big: %s\r\ncontent-length: 0\r\n\r\n" % value

    limit = MAX_ANSWER_HEAD_BYTES - len(b"content-length") - 1
    events, error, _, _ = read_answers(reader_class, answer_with_header_of(limit))
    assert error is None and events[-1] == ("complete", True)
    # Refused whole or in pieces, before the rest of the head is kept.
    big = answer_with_header_of(MAX_ANSWER_HEAD_BYTES + 1)
    for pieces in ((big,), (big[:40_000], big[40_000:])):
        events, error, _, _ = read_answers(reader_class, *pieces)
        assert error == f"the answer's head is larger than {MAX_ANSWER_HEAD_BYTES} bytes"
        assert events == []


@pytest.mark.parametrize("reader_class", READERS)
def test_header_names_are_lower_cased_whatever_their_characters(reader_class):
    """Every character a header name may have (RFC 9110 tokens), in names long enough to be
    lower-cased 8 bytes at a time and in the bytes after."""
    name = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~"
    [request], refusal, _ = read(reader_class, b"GET / HTTP/1.1\r\nHost: h\r\n%s: v\r\n\r\n" % name)
    assert refusal is None
    assert request[4] == name.lower() + b": v\r\n"

"""The engine load page reader in C (router/load/_loadread.pyx) and its Python twin give the same
answers: the same reading of any page, and the same framing of any answer however its bytes
are split."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.load import _loadread, loadread_py
from router.load.loadseries import COMPLETE, NEED_MORE, NOT_HTTP, SERIES, TOO_LARGE, BadReading

IMPLEMENTATIONS = {"extension": _loadread, "twin": loadread_py}
NAMES = sorted(SERIES) + [b"vllm:num_requests_running_total", b"process_cpu_seconds_total"]

label_value = st.text(alphabet='ab}{ "\\=,', max_size=6).map(
    lambda v: '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
)
labels = st.one_of(
    st.just(""),
    st.lists(st.tuples(st.sampled_from(["model_name", "engine"]), label_value), max_size=2).map(
        lambda pairs: "{" + ",".join(f"{k}={v}" for k, v in pairs) + "}"
    ),
)
values = st.one_of(
    st.integers(0, 10**6).map(str),
    st.floats(0, 1e6, allow_nan=False).map(repr),
    st.sampled_from(["NaN", "+Inf", "-1", "-0", "1e3", "", "lots", "0x1p3", "1_0", "5.", ".5"]),
)
sample = st.builds(
    lambda name, lab, blank, value, stamp, end: (
        name + lab.encode() + blank + value.encode() + stamp + end
    ),
    st.sampled_from(NAMES),
    labels,
    st.sampled_from([b" ", b"\t", b"  "]),
    values,
    st.sampled_from([b"", b" 1700000000000"]),
    st.sampled_from([b"\n", b"\r\n"]),
)
line = st.one_of(sample, st.sampled_from([b"# HELP vllm:num_requests_waiting x\n", b"\n"]))


def answer(page_reading):
    try:
        return ("reading", page_reading())
    except BadReading:
        return ("bad",)


@settings(max_examples=400, deadline=None)
@given(st.lists(line, max_size=12).map(b"".join))
def test_both_scanners_read_every_page_alike(page):
    c = answer(lambda: _loadread.scan_load(page))
    py = answer(lambda: loadread_py.scan_load(page))
    assert c == py, page


def response(body: bytes, framing: str, status: int = 200) -> bytes:
    head = f"HTTP/1.1 {status} OK\r\ncontent-type: text/plain\r\n".encode()
    if framing == "length":
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    if framing == "chunked":
        half = len(body) // 2
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:half], body[half:]) if p)
        return head + b"transfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    return head + b"connection: close\r\n\r\n" + body  # to the close


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(1, 400), max_size=6))
def test_an_answer_is_framed_alike_however_its_bytes_are_split(impl, framing, cuts):
    body = b'vllm:num_requests_waiting{model_name="m"} 3\nvllm:num_requests_running 2\n'
    data = response(body, framing)
    reader = IMPLEMENTATIONS[impl].PageReader(1 << 20)
    said, at = NEED_MORE, 0
    for cut in [*sorted(set(cuts)), len(data)]:
        if cut > at:
            said = reader.feed(data[at:cut])
            at = cut
            if said != NEED_MORE:
                break
    if framing == "close":
        assert said == NEED_MORE
        said = reader.feed_eof()
    assert said == COMPLETE and reader.status == 200
    assert reader.keep_alive == (framing != "close")
    assert tuple(reader.reading()) == (3, 2, 0.0)


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
def test_a_kept_connection_reads_answer_after_answer(impl):
    reader = IMPLEMENTATIONS[impl].PageReader(1 << 20)
    for n in range(3):
        reader.next()
        said = reader.feed(response(b"sglang:num_queue_reqs %d\n" % n, "length"))
        assert said == COMPLETE and reader.reading().waiting == n


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
def test_what_is_not_a_page_is_said(impl):
    module = IMPLEMENTATIONS[impl]
    assert module.PageReader(1 << 20).feed(b"SSH-2.0-OpenSSH_9.6\r\n") == NOT_HTTP
    big = module.PageReader(100)
    assert big.feed(response(b"x" * 101, "length")) == TOO_LARGE
    chunked = module.PageReader(100)
    assert chunked.feed(response(b"x" * 300, "chunked")) == TOO_LARGE
    missing = module.PageReader(1 << 20)
    assert missing.feed(response(b"not found", "length", 404)) == COMPLETE
    assert missing.status == 404
    cut = module.PageReader(1 << 20)
    assert cut.feed(response(b"vllm:num_requests_running 1\n", "length")[:-5]) == NEED_MORE
    assert cut.feed_eof() == NOT_HTTP, "a body cut short of its length is no answer"
    unasked = module.PageReader(1 << 20)
    assert unasked.feed(response(b"", "length")) == COMPLETE
    assert unasked.feed(b"HTTP/1.1 200 OK\r\n") == NOT_HTTP, "bytes nobody asked for"

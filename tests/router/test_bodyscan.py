"""The C body scan against orjson's reading: where the scan vouches for a body, the model and
every affinity key it gives are the ones the parsed body gives; it never vouches for a body
orjson refuses."""

import json
import zlib

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from router.protocol._bodyscan import scan_body

from router.path import affinity
from router.path.affinity import PREFIX, SESSION
from router.protocol import bodyscan

COMPLETION = b'{"model": "m", "prompt": "hi", "max_tokens": 4}'
CHAT = json.dumps(
    {
        "model": "llama-3-8b",
        "messages": [
            {"role": "system", "content": "Be brief.\nAnswer in French."},
            {"role": "user", "content": 'Caf\u00e9? \U0001f600 "quoted"'},
            {"role": "assistant", "content": "Oui."},
        ],
        "temperature": 0.7,
        "stream": True,
    }
).encode()


def keys_agree(body: bytes, session_id: bytes | None, mode: str, chars: int) -> None:
    scanned = scan_body(body)
    parsed = orjson.loads(body)
    assert scanned is not None
    assert scanned.model == parsed["model"]
    assert affinity.affinity_key(scanned, session_id, mode, chars) == affinity.affinity_key(
        parsed, session_id, mode, chars
    )


def test_the_router_uses_the_scan_when_built():
    assert bodyscan.USING_EXTENSION
    assert bodyscan.scan_body is scan_body


IMAGE_PARTS = json.dumps(
    {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "u"}}, {"text": None}, "x"]
                + [{"type": "text", "text": "what is this?"}],
            }
        ],
    }
).encode()


@pytest.mark.parametrize(
    "body", [COMPLETION, CHAT, IMAGE_PARTS], ids=["completion", "chat", "image-parts"]
)
def test_common_bodies_are_scanned_and_agree_with_the_parsed_body(body):
    for chars in (1, 5, 16, 4096):
        for mode in (PREFIX, SESSION):
            keys_agree(body, None, mode, chars)
            keys_agree(body, b"s-1", mode, chars)


def test_the_chat_prefix_key_is_the_crc_of_the_prompt_root():
    scanned = scan_body(CHAT)
    root = '<|system|>Be brief.\nAnswer in French.<|user|>Caf\u00e9? \U0001f600 "quoted"'
    assert scanned.affinity_key(None, True, 4096) == zlib.crc32(root.encode()) + 1
    assert scanned.affinity_key(None, True, 12) == zlib.crc32(root[:12].encode()) + 1
    assert scanned.affinity_key(b"s-1", True, 4096) == zlib.crc32(b"s-1") + 1
    assert scanned.affinity_key(None, False, 4096) == 0


@pytest.mark.parametrize("length", [1, 63, 64, 65, 200])
def test_keys_of_short_and_long_texts_are_zlibs_crc(length):
    """Short texts are hashed by the scan's own table, long ones by zlib: the same CRC-32."""
    text = ("a\u00e9\n" * length)[:length]
    body = json.dumps({"model": "m", "prompt": text}, ensure_ascii=False).encode()
    assert scan_body(body).affinity_key(None, True, 4096) == zlib.crc32(text.encode()) + 1
    session = json.dumps({"model": "m", "user": text}, ensure_ascii=False).encode()
    assert scan_body(session).affinity_key(None, True, 4096) == zlib.crc32(text.encode()) + 1
    header = text.encode()
    assert scan_body(COMPLETION).affinity_key(header, True, 4096) == zlib.crc32(header) + 1


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","user":5}',  # str(5) in Python
        b'{"model":"m","prompt_cache_key":true}',
        b'{"model":"m","messages":[{"role":null,"content":"x"}]}',
        b'{"model":"m","messages":[{"role":"user","content":7}]}',
        b'{"model":"m","messages":[{"r\\u006fle":"user","content":"x"}]}',
    ],
)
def test_values_python_turns_into_text_are_left_to_the_parsed_body(body):
    scanned = scan_body(body)
    assert scanned is not None
    assert scanned.affinity_key(None, True, 4096) == -1
    # ...and the router's key is then the parsed body's.
    parsed = affinity.affinity_key(orjson.loads(body), None, PREFIX, 4096)
    assert affinity.affinity_key(scanned, None, PREFIX, 4096) == parsed


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b"{}",
        b'{"model": ""}',
        b'{"model": 5}',
        b'{"prompt": "no model"}',
        b'{"model": "m\\u0031"}',  # an escaped model is left to orjson to decode
        b'{"mod\\u0065l": "m"}',  # an escaped key might spell a routed one
        b'\xef\xbb\xbf{"model": "m"}',  # a byte order mark
        b'{"model": "m",}',
        b'{"model": "m"} x',
        b'{"model": "m", "a": [1,]}',
        b'{"model": "m", "a": 01}',
        b'{"model": "m", "a": 1.}',
        b'{"model": "m", "a": 1e400}',
        b'{"model": "m", "a": 1e5000}',
        b'{"model": "m", "a": "\\ud800"}',  # a lone surrogate
        b'{"model": "m", "a": "\\udc00\\ud800"}',
        b'{"model": "m", "a": "\xed\xa0\x80"}',  # an encoded surrogate
        b'{"model": "m", "a": "\xc0\xaf"}',  # overlong
        b'{"model": "m", "a": "\xf4\x90\x80\x80"}',  # past U+10FFFF
        b'{"model": "m", "a": "\xe2\x82"}',  # cut short
        b'{"model": "m", "a": "tab\there"}',  # a raw control character
        b'{"model": "m", "a": "\\x"}',
        b'{"model": "m", "a": tru}',
        b'{"model": "m", "a": NaN}',
        b'{"model": "m", "a": ' + b"[" * 100 + b"]" * 100 + b"}",  # deep: orjson decides
        b'{"model": "m"',
        b'{"model" "m"}',
        b'{"model": "m", "prompt": "' + b"x" * 600 + b'"}',  # long: orjson reads it faster
    ],
)
def test_what_the_scan_cannot_vouch_for_is_left_to_orjson(body):
    assert scan_body(body) is None


JSON_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
ROUTED_KEYS = st.sampled_from(
    ["model", "prompt", "messages", "user", "prompt_cache_key", "role", "content", "text"]
)
SCALARS = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | JSON_TEXT
SCALARS |= st.floats(allow_nan=False, allow_infinity=False, width=32)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(ROUTED_KEYS | JSON_TEXT, inner, max_size=4)
    ),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["system", "user", "assistant"]) | VALUES,
        "content": JSON_TEXT
        | st.lists(st.fixed_dictionaries({}, optional={"text": JSON_TEXT | VALUES}) | VALUES)
        | VALUES,
    },
)
BODIES = st.fixed_dictionaries(
    {"model": JSON_TEXT},
    optional={
        "prompt": JSON_TEXT | st.lists(JSON_TEXT | VALUES, max_size=3) | VALUES,
        "messages": st.lists(MESSAGE | VALUES, max_size=4) | VALUES,
        "user": JSON_TEXT | VALUES,
        "prompt_cache_key": JSON_TEXT | VALUES,
        "stream": st.booleans(),
    },
)


def compact(payload) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def encodings(payload: dict):
    yield compact(payload)
    yield json.dumps(payload).encode()  # \u escapes for all that is not ASCII
    yield json.dumps(payload, ensure_ascii=False, indent=1).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    BODIES,
    st.sampled_from([PREFIX, SESSION]),
    st.integers(1, 40),
    st.sampled_from([None, b"", b"s-1"]),
)
def test_where_the_scan_vouches_it_agrees_with_the_parsed_body(payload, mode, chars, session_id):
    for body in encodings(payload):
        parsed = orjson.loads(body)
        scanned = scan_body(body)
        if scanned is None:
            continue
        assert scanned.model == parsed["model"]
        want = affinity.affinity_key(parsed, session_id, mode, chars)
        assert affinity.affinity_key(scanned, session_id, mode, chars) == want


PLAIN_TEXT = st.text(
    alphabet=st.characters(
        codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters='"\\'
    ),
    max_size=12,
)
PLAIN_VALUES = st.recursive(
    st.none() | st.booleans() | PLAIN_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(PLAIN_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {"model": PLAIN_TEXT.filter(bool)},
        optional={"prompt": PLAIN_VALUES, "messages": PLAIN_VALUES, "user": PLAIN_VALUES},
    )
)
def test_bodies_without_escapes_or_numbers_are_scanned(payload):
    body = orjson.dumps(payload)
    assume(len(body) <= 512)  # longer ones go to orjson, which reads them faster
    assert scan_body(body) is not None


@settings(max_examples=500, deadline=None)
@given(BODIES, st.data())
def test_the_scan_never_vouches_for_what_orjson_refuses(payload, data):
    body = bytearray(compact(payload))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(body) - 1))
        action = data.draw(st.sampled_from(["flip", "drop", "insert"]))
        if action == "flip":
            body[at] = data.draw(st.integers(0, 255))
        elif action == "drop":
            del body[at]
        else:
            body.insert(at, data.draw(st.sampled_from(list(b'{}[],:"\\ \x00\x80\xff0e-.tnf'))))
    scanned = scan_body(bytes(body))
    if scanned is not None:
        parsed = orjson.loads(bytes(body))  # raises if the scan vouched for invalid JSON
        assert type(parsed) is dict and parsed["model"] == scanned.model

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The fields of a JSON request body the router routes by, read in C without building the
body as Python objects: the model, and what the affinity key is made of.

A body of up to MAX_SCANNED_BYTES (short requests: the scan's gain is in objects not made,
and orjson reads long bodies faster) is checked whole as JSON in one pass, which notes where
the top-level `model`, `prompt_cache_key`, `user`, `messages` and `prompt` begin; only
`model` becomes a Python string. The scan decides only what it is sure of: a body it cannot vouch for (invalid JSON,
or what orjson might read otherwise: an escaped key, a number near a double's limits, a
surrogate escape, deep nesting, a model that is not a plain string) gives None, and the
caller parses the body with orjson as before. So every answer, refusals included, is the one
orjson's reading gives; the scan only spares building what nobody reads.

Likewise the affinity key: `BodyFields.affinity_key` gives -1 for any value that
`router.path.affinity` would turn into text by `str()` (a number, a boolean), and the caller then
computes the key from the parsed body.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint32_t, uint64_t
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcmp, memcpy

cimport cython
from orjson import loads
from zlib import crc32

cdef enum:
    UNSURE = -1
    # Bodies longer than this are parsed by orjson, which is faster there: its SIMD outruns
    # this byte-at-a-time scan past some 600 bytes of escaped ASCII (measured: at 412 bytes the
    # scan and its prefix key take 1.25 µs against orjson's 1.33, at 1216 bytes 2.9 against
    # 1.9). Below, the scan wins by not building the body as objects.
    MAX_SCANNED_BYTES = 512
    # A nesting depth beyond which the scan leaves the body to orjson (which allows 1024).
    MAX_DEPTH = 64
    # Numbers longer than this, or with an exponent of more than two digits, are left to
    # orjson: shorter ones cannot overflow a double.
    MAX_NUMBER_CHARS = 32

cdef enum Field:
    OTHER, MODEL, PROMPT_CACHE_KEY, USER, MESSAGES, PROMPT, MAX_TOKENS, MAX_COMPLETION_TOKENS


# A bound on what a request may generate, as completion_bound() gives it.
cdef enum:
    NO_BOUND_ = -1  # the body names none (or null)
    BAD_BOUND_ = -2  # it names one that is not a whole number: the request is refused
    MOST_DIGITS = 18  # a long long's worth: larger is no count of tokens
NO_BOUND = NO_BOUND_
BAD_BOUND = BAD_BOUND_


cdef inline bint is_space(unsigned char c) noexcept nogil:
    return c == 32 or c == 10 or c == 13 or c == 9


cdef inline Py_ssize_t skip_space(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    while i < n and is_space(s[i]):
        i += 1
    return i


cdef inline int hex_value(unsigned char c) noexcept nogil:
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


cdef long read_hex4(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The code unit of the four hex digits at s[i:i+4], or -1."""
    cdef long unit = 0
    cdef int digit
    cdef Py_ssize_t k
    if i + 4 > n:
        return -1
    for k in range(i, i + 4):
        digit = hex_value(s[k])
        if digit < 0:
            return -1
        unit = unit * 16 + digit
    return unit


cdef inline Py_ssize_t utf8_sequence(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The length of the well-formed UTF-8 sequence at s[i] (a byte >= 0x80), or UNSURE:
    overlong forms, encoded surrogates and code points past U+10FFFF are not UTF-8."""
    cdef unsigned char c = s[i]
    cdef unsigned char low = 0x80, high = 0xBF
    cdef Py_ssize_t length, k
    if 0xC2 <= c <= 0xDF:
        length = 2
    elif 0xE0 <= c <= 0xEF:
        length = 3
        if c == 0xE0:
            low = 0xA0
        elif c == 0xED:
            high = 0x9F
    elif 0xF0 <= c <= 0xF4:
        length = 4
        if c == 0xF0:
            low = 0x90
        elif c == 0xF4:
            high = 0x8F
    else:
        return UNSURE
    if i + length > n or not (low <= s[i + 1] <= high):
        return UNSURE
    for k in range(i + 2, i + length):
        if not (0x80 <= s[k] <= 0xBF):
            return UNSURE
    return length


cdef inline bint plain_word(uint64_t word) noexcept nogil:
    """Whether none of 8 bytes is a quote, a backslash, a control byte or beyond ASCII (a
    word-at-a-time test; it may say no for a plain word, never yes for one that is not)."""
    cdef uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL
    cdef uint64_t quotes = word ^ (ones * 0x22), backslashes = word ^ (ones * 0x5C)
    return (
        ((quotes - ones) & ~quotes) | ((backslashes - ones) & ~backslashes)
        | (word - ones * 0x20) | word
    ) & highs == 0


cdef Py_ssize_t skip_string(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """s[i] is the opening quote: the index after the closing one, or UNSURE."""
    cdef unsigned char c
    cdef long unit
    cdef Py_ssize_t length
    cdef uint64_t word
    # Where the byte loop may hand over to words again: past a word that is not plain, and
    # not before the 16th byte (most strings, keys and short values, end sooner).
    cdef Py_ssize_t bytewise_until = i + 16
    i += 1
    while i < n:
        # Long prompts are mostly plain text: 8 bytes at a time while they are.
        if i >= bytewise_until and i + 8 <= n:
            memcpy(&word, s + i, 8)
            if plain_word(word):
                i += 8
                continue
            bytewise_until = i + 8
        c = s[i]
        if c == 34:  # "
            return i + 1
        if c == 92:  # backslash
            if i + 1 >= n:
                return UNSURE
            c = s[i + 1]
            if c == 117:  # u
                unit = read_hex4(s, i + 2, n)
                if unit < 0 or 0xDC00 <= unit <= 0xDFFF:
                    return UNSURE
                i += 6
                if 0xD800 <= unit <= 0xDBFF:  # a high surrogate: its low one must follow
                    if i + 1 >= n or s[i] != 92 or s[i + 1] != 117:
                        return UNSURE
                    unit = read_hex4(s, i + 2, n)
                    if not (0xDC00 <= unit <= 0xDFFF):
                        return UNSURE
                    i += 6
            elif c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 or c == 116:
                i += 2
            else:
                return UNSURE
        elif c < 0x20:
            return UNSURE
        elif c < 0x80:
            i += 1
        else:
            length = utf8_sequence(s, i, n)
            if length == UNSURE:
                return UNSURE
            i += length
    return UNSURE


cdef Py_ssize_t skip_digits(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    while i < n and 48 <= s[i] <= 57:
        i += 1
    return i


cdef Py_ssize_t skip_number(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t start = i, digits_end
    if s[i] == 45:  # -
        i += 1
    if i >= n:
        return UNSURE
    if s[i] == 48:  # a leading 0 stands alone
        i += 1
    elif 49 <= s[i] <= 57:
        i = skip_digits(s, i, n)
    else:
        return UNSURE
    if i < n and s[i] == 46:  # .
        digits_end = skip_digits(s, i + 1, n)
        if digits_end == i + 1:
            return UNSURE
        i = digits_end
    if i < n and (s[i] == 101 or s[i] == 69):  # e E
        i += 1
        if i < n and (s[i] == 43 or s[i] == 45):
            i += 1
        digits_end = skip_digits(s, i, n)
        if digits_end == i or digits_end - i > 2:
            return UNSURE
        i = digits_end
    if i - start > MAX_NUMBER_CHARS:
        return UNSURE
    return i


cdef Py_ssize_t skip_word(const unsigned char* s, Py_ssize_t i, Py_ssize_t n,
                          const char* word, Py_ssize_t length) noexcept nogil:
    if i + length <= n and memcmp(s + i, word, length) == 0:
        return i + length
    return UNSURE


cdef Py_ssize_t skip_value(const unsigned char* s, Py_ssize_t i, Py_ssize_t n, int depth) noexcept nogil:
    """The index after the JSON value at s[i] (no space before it), or UNSURE."""
    cdef unsigned char c
    if i >= n:
        return UNSURE
    c = s[i]
    if c == 34:
        return skip_string(s, i, n)
    if c == 123:  # {
        return skip_container(s, i, n, depth + 1, 125, True)
    if c == 91:  # [
        return skip_container(s, i, n, depth + 1, 93, False)
    if c == 116:
        return skip_word(s, i, n, b"true", 4)
    if c == 102:
        return skip_word(s, i, n, b"false", 5)
    if c == 110:
        return skip_word(s, i, n, b"null", 4)
    if c == 45 or 48 <= c <= 57:
        return skip_number(s, i, n)
    return UNSURE


cdef Py_ssize_t skip_container(const unsigned char* s, Py_ssize_t i, Py_ssize_t n, int depth,
                               unsigned char closer, bint keyed) noexcept nogil:
    """s[i] opens an object (keyed) or an array: the index after its closer, or UNSURE."""
    if depth > MAX_DEPTH:
        return UNSURE
    i = skip_space(s, i + 1, n)
    if i < n and s[i] == closer:
        return i + 1
    while True:
        if keyed:
            if i >= n or s[i] != 34:
                return UNSURE
            i = skip_string(s, i, n)
            if i == UNSURE:
                return UNSURE
            i = skip_space(s, i, n)
            if i >= n or s[i] != 58:  # :
                return UNSURE
            i = skip_space(s, i + 1, n)
        i = skip_value(s, i, n, depth)
        if i == UNSURE:
            return UNSURE
        i = skip_space(s, i, n)
        if i >= n:
            return UNSURE
        if s[i] == closer:
            return i + 1
        if s[i] != 44:  # ,
            return UNSURE
        i = skip_space(s, i + 1, n)


cdef Field field_named(const unsigned char* name, Py_ssize_t length) noexcept nogil:
    """Which routed field a key (its bytes between the quotes, no escape in them) names."""
    if length == 5 and memcmp(name, b"model", 5) == 0:
        return MODEL
    if length == 6 and memcmp(name, b"prompt", 6) == 0:
        return PROMPT
    if length == 8 and memcmp(name, b"messages", 8) == 0:
        return MESSAGES
    if length == 4 and memcmp(name, b"user", 4) == 0:
        return USER
    if length == 16 and memcmp(name, b"prompt_cache_key", 16) == 0:
        return PROMPT_CACHE_KEY
    if length == 10 and memcmp(name, b"max_tokens", 10) == 0:
        return MAX_TOKENS
    if length == 21 and memcmp(name, b"max_completion_tokens", 21) == 0:
        return MAX_COMPLETION_TOKENS
    return OTHER


cdef long long whole_number_at(const unsigned char* s, Py_ssize_t at, Py_ssize_t n) noexcept nogil:
    """The whole number a JSON value at `at` is; NO_BOUND for null; BAD_BOUND for anything
    else (a string, a fraction, an exponent, a sign, too many digits)."""
    cdef long long value = 0
    cdef int digits = 0
    if at + 4 <= n and memcmp(s + at, b"null", 4) == 0:
        return NO_BOUND_
    while at < n and 48 <= s[at] <= 57:
        digits += 1
        if digits > MOST_DIGITS:
            return BAD_BOUND_
        value = value * 10 + (s[at] - 48)
        at += 1
    if digits == 0 or (at < n and (s[at] == 46 or s[at] == 101 or s[at] == 69)):  # . e E
        return BAD_BOUND_
    return value


cdef bint has_escape(const unsigned char* s, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(start, end):
        if s[k] == 92:
            return True
    return False


# Decoding strings into text: UTF-8 bytes in a buffer, which stops taking code points at a
# limit (as Python's text[:limit] would). Its key is its CRC-32: short texts by the table below,
# long ones by zlib's crc32, which is faster per byte but costs a Python call.

cdef uint32_t CRC_TABLE[256]


cdef void make_crc_table() noexcept:
    """CRC-32 as zlib computes it (the reflected polynomial 0xEDB88320), a byte at a time."""
    cdef uint32_t value, polynomial = 0xEDB88320
    cdef int byte, bit
    for byte in range(256):
        value = byte
        for bit in range(8):
            value = (value >> 1) ^ (polynomial if value & 1 else 0)
        CRC_TABLE[byte] = value


make_crc_table()

cdef enum:
    SHORT_TEXT = 64  # bytes: up to this, the table's loop is quicker than a call to zlib


cdef extern from *:
    int popcount64 "__builtin_popcountll"(unsigned long long) nogil


cdef struct Text:
    unsigned char* data
    Py_ssize_t size
    Py_ssize_t code_points
    Py_ssize_t limit  # code points


cdef int text_start(Text* text, Py_ssize_t capacity, Py_ssize_t limit) except -1:
    text.data = <unsigned char*>PyMem_Malloc(capacity + 1)
    if text.data == NULL:
        raise MemoryError()
    text.size = text.code_points = 0
    text.limit = limit
    return 0


cdef long long table_key(const unsigned char* data, Py_ssize_t size) noexcept nogil:
    """CRC-32 plus one, by the table: for short data."""
    cdef uint32_t crc = ~(<uint32_t>0)
    cdef Py_ssize_t k
    for k in range(size):
        crc = CRC_TABLE[(crc ^ data[k]) & 0xFF] ^ (crc >> 8)
    return <long long>(~crc) + 1


cdef long long text_key(Text* text) except -2:
    """The key of the text: its CRC-32 plus one (0 stays "no key"), as router.path.affinity's."""
    if text.size == 0:
        return 0
    if text.size > SHORT_TEXT:
        return crc32(PyBytes_FromStringAndSize(<char*>text.data, text.size)) + 1
    return table_key(text.data, text.size)


cdef long long bytes_key(bytes data) except -2:
    """The key of a session header (not empty): as text_key."""
    if PyBytes_GET_SIZE(data) > SHORT_TEXT:
        return crc32(data) + 1
    return table_key(<const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef inline bint text_full(Text* text) noexcept nogil:
    return text.code_points >= text.limit


cdef Py_ssize_t continuation_bytes(const unsigned char* data, Py_ssize_t length) noexcept nogil:
    """How many bytes of UTF-8 are not the first of a code point (10xxxxxx)."""
    cdef uint64_t word, highs = 0x8080808080808080ULL
    cdef Py_ssize_t k = 0, count = 0
    while k + 8 <= length:
        memcpy(&word, data + k, 8)
        count += popcount64(word & ~(word << 1) & highs)
        k += 8
    while k < length:
        count += (data[k] & 0xC0) == 0x80
        k += 1
    return count


cdef void text_add(Text* text, const unsigned char* data, Py_ssize_t length) noexcept nogil:
    """Appends UTF-8 bytes up to the limit: a sequence's lead byte counts one code point."""
    cdef Py_ssize_t k
    cdef unsigned char c
    if text.limit - text.code_points >= length:  # each byte is one code point at most: all fit
        memcpy(text.data + text.size, data, length)
        text.size += length
        text.code_points += length - continuation_bytes(data, length)
        return
    for k in range(length):
        c = data[k]
        if c & 0xC0 != 0x80:
            if text.code_points >= text.limit:
                return
            text.code_points += 1
        text.data[text.size] = c
        text.size += 1


cdef inline bint has_quote_or_backslash(uint64_t word) noexcept nogil:
    cdef uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL
    cdef uint64_t quotes = word ^ (ones * 0x22), backslashes = word ^ (ones * 0x5C)
    return (((quotes - ones) & ~quotes) | ((backslashes - ones) & ~backslashes)) & highs != 0


cdef inline Py_ssize_t plain_run_end(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The index of the next quote or backslash from s[i] in a checked string of s[:n]."""
    cdef uint64_t word
    while i + 8 <= n:
        memcpy(&word, s + i, 8)
        if has_quote_or_backslash(word):
            break
        i += 8
    while s[i] != 34 and s[i] != 92:
        i += 1
    return i


cdef void text_add_code_point(Text* text, long point) noexcept nogil:
    cdef unsigned char encoded[4]
    cdef Py_ssize_t length
    if point < 0x80:
        encoded[0] = <unsigned char>point
        length = 1
    elif point < 0x800:
        encoded[0] = <unsigned char>(0xC0 | (point >> 6))
        encoded[1] = <unsigned char>(0x80 | (point & 0x3F))
        length = 2
    elif point < 0x10000:
        encoded[0] = <unsigned char>(0xE0 | (point >> 12))
        encoded[1] = <unsigned char>(0x80 | ((point >> 6) & 0x3F))
        encoded[2] = <unsigned char>(0x80 | (point & 0x3F))
        length = 3
    else:
        encoded[0] = <unsigned char>(0xF0 | (point >> 18))
        encoded[1] = <unsigned char>(0x80 | ((point >> 12) & 0x3F))
        encoded[2] = <unsigned char>(0x80 | ((point >> 6) & 0x3F))
        encoded[3] = <unsigned char>(0x80 | (point & 0x3F))
        length = 4
    text_add(text, encoded, length)


cdef void decode_string(Text* text, const unsigned char* s, Py_ssize_t n, Py_ssize_t i) noexcept nogil:
    """Appends the text of the (already checked) JSON string at s[i] until the limit."""
    cdef unsigned char c
    cdef Py_ssize_t run
    cdef long point
    i += 1
    while not text_full(text):
        run = i
        i = plain_run_end(s, i, n)
        text_add(text, s + run, i - run)
        if s[i] == 34:
            return
        c = s[i + 1]
        if c == 117:
            point = read_hex4(s, i + 2, i + 6)
            i += 6
            if 0xD800 <= point <= 0xDBFF:
                point = 0x10000 + ((point - 0xD800) << 10) + (read_hex4(s, i + 2, i + 6) - 0xDC00)
                i += 6
            text_add_code_point(text, point)
            continue
        if c == 98:
            c = 8
        elif c == 102:
            c = 12
        elif c == 110:
            c = 10
        elif c == 114:
            c = 13
        elif c == 116:
            c = 9
        text_add(text, &c, 1)
        i += 2


cdef inline bint is_empty_string_at(const unsigned char* s, Py_ssize_t at) noexcept nogil:
    return s[at] == 34 and s[at + 1] == 34


cdef inline bint is_null_at(const unsigned char* s, Py_ssize_t at) noexcept nogil:
    return s[at] == 110


cdef long long string_key(bytes body, Py_ssize_t at) except -2:
    cdef Text text
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    text_start(&text, n, n)  # no string is longer than the body
    try:
        decode_string(&text, <const unsigned char*>PyBytes_AS_STRING(body), n, at)
        return text_key(&text)
    finally:
        PyMem_Free(text.data)


cdef int session_at(const unsigned char* s, Py_ssize_t at) noexcept nogil:
    """1: a session string; 0: no session here (absent, null, ""); UNSURE: a value that
    router.path.affinity would make into text with str()."""
    if at < 0 or is_null_at(s, at) or is_empty_string_at(s, at):
        return 0
    return 1 if s[at] == 34 else UNSURE


cdef long long prefix_key(bytes body, Py_ssize_t messages_at, Py_ssize_t prompt_at,
                          Py_ssize_t prefix_chars) except -2:
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    cdef Text text
    # Each message adds "<|" and "|>" to its role and content: 4 bytes, and it takes 2 at
    # least in the body ("{}"); decoded strings are no longer than their JSON. And no more
    # than prefix_chars code points are kept, 4 bytes each at most.
    text_start(&text, min(2 * n + 16, 4 * prefix_chars + 16), prefix_chars)
    try:
        if messages_at >= 0 and s[messages_at] == 91:
            if not prompt_root(&text, s, n, messages_at):
                return UNSURE
        else:
            prompt_text(&text, s, n, prompt_at)
        return text_key(&text)
    finally:
        PyMem_Free(text.data)


@cython.freelist(8)
cdef class BodyFields:
    """Where the routed fields of one checked JSON body begin (-1: absent)."""

    cpdef object loaded(self):
        """The body parsed whole, for what the scan leaves undecided."""
        return loads(self.body)

    cpdef long long completion_bound(self):
        """What the request may generate, as vLLM reads it: the top-level
        `max_completion_tokens`, else `max_tokens`; NO_BOUND when it names neither (or null),
        BAD_BOUND when the one it names is not a whole number."""
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(self.body)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(self.body)
        cdef long long bound = NO_BOUND_
        if self.max_completion_at >= 0:
            bound = whole_number_at(s, self.max_completion_at, n)
        if bound == NO_BOUND_ and self.max_tokens_at >= 0:
            bound = whole_number_at(s, self.max_tokens_at, n)
        return bound

    cpdef long long affinity_key(self, bytes session_header, bint by_prefix,
                                 Py_ssize_t prefix_chars) except -2:
        """router.path.affinity.affinity_key for this body (a session, else the prompt's root when
        by_prefix), or -1 where only the parsed body can tell."""
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(self.body)
        cdef int found = session_at(s, self.cache_key_at)
        if found:
            return UNSURE if found == UNSURE else string_key(self.body, self.cache_key_at)
        if session_header:
            return bytes_key(session_header)
        found = session_at(s, self.user_at)
        if found:
            return UNSURE if found == UNSURE else string_key(self.body, self.user_at)
        if not by_prefix:
            return 0
        if prefix_chars <= 0:
            return UNSURE
        return prefix_key(self.body, self.messages_at, self.prompt_at, prefix_chars)


cdef void prompt_text(Text* text, const unsigned char* s, Py_ssize_t n, Py_ssize_t at) noexcept nogil:
    """`prompt`: a string, or the first of a list of strings; anything else has no text."""
    if at < 0:
        return
    if s[at] == 91:
        at = skip_space(s, at + 1, n)
    if s[at] == 34:
        decode_string(text, s, n, at)


cdef Py_ssize_t skip_checked_string(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """s[i] opens a string the scan has checked: the index after its closing quote."""
    i += 1
    while True:
        i = plain_run_end(s, i, n)
        if s[i] == 34:
            return i + 1
        i += 2  # an escape (the hex digits of a \u escape are plain)


cdef Py_ssize_t skip_checked(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The index after the value at s[i] of a body the scan has checked: brackets are counted
    and strings skipped, nothing is checked again."""
    cdef unsigned char c = s[i]
    cdef Py_ssize_t depth = 0
    if c == 34:
        return skip_checked_string(s, i, n)
    if c != 123 and c != 91:  # a number, true, false or null
        while i < n and s[i] != 44 and s[i] != 125 and s[i] != 93 and not is_space(s[i]):
            i += 1
        return i
    while True:
        c = s[i]
        if c == 34:
            i = skip_checked_string(s, i, n)
            continue
        if c == 123 or c == 91:
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1


cdef bint prompt_root(Text* text, const unsigned char* s, Py_ssize_t n, Py_ssize_t at) noexcept nogil:
    """The messages up to the first user one, as `<|role|>content` (router.path.affinity's
    prompt_prefix); False where a role, content or text part is of a type it turns into text
    with str(), or where a message key is escaped."""
    cdef Py_ssize_t role_at, content_at, end
    cdef bint is_user
    at = skip_space(s, at + 1, n)
    while s[at] != 93 and not text_full(text):
        if s[at] == 123:
            role_at = content_at = -1
            end = object_members(s, n, at, b"role", 4, &role_at, b"content", 7, &content_at)
            if end == UNSURE:
                return False
            if role_at >= 0 and (s[role_at] != 34 or has_escape(s, role_at + 1, skip_checked_string(s, role_at, n) - 1)):
                return False  # not text, or an escaped role that might spell "user"
            if content_at >= 0 and not (s[content_at] == 34 or s[content_at] == 91 or is_null_at(s, content_at)):
                return False
            text_add(text, b"<|", 2)
            is_user = False
            if role_at >= 0:
                is_user = s[role_at + 5] == 34 and memcmp(s + role_at, b'"user"', 6) == 0
                decode_string(text, s, n, role_at)
            text_add(text, b"|>", 2)
            if content_at >= 0 and s[content_at] == 34:
                decode_string(text, s, n, content_at)
            elif content_at >= 0 and s[content_at] == 91:
                if not content_parts(text, s, n, content_at):
                    return False
            if is_user:
                break
        else:
            end = skip_checked(s, at, n)
        at = skip_space(s, end, n)
        if s[at] == 44:
            at = skip_space(s, at + 1, n)
    return True


cdef Py_ssize_t object_members(const unsigned char* s, Py_ssize_t n, Py_ssize_t at,
                               const char* first, Py_ssize_t first_length, Py_ssize_t* first_at,
                               const char* second, Py_ssize_t second_length, Py_ssize_t* second_at) noexcept nogil:
    """Where the values of two keys of the (checked) object at s[at] begin (the last of each,
    as a dict keeps them); returns the index after the object, or UNSURE if a key is escaped,
    as it might then spell one of them."""
    cdef Py_ssize_t key_end
    at = skip_space(s, at + 1, n)
    while s[at] != 125:
        key_end = skip_checked_string(s, at, n)
        if has_escape(s, at + 1, key_end - 1):
            return UNSURE
        if key_end - at - 2 == first_length and memcmp(s + at + 1, first, first_length) == 0:
            first_at[0] = skip_space(s, skip_space(s, key_end, n) + 1, n)
        elif key_end - at - 2 == second_length and memcmp(s + at + 1, second, second_length) == 0:
            second_at[0] = skip_space(s, skip_space(s, key_end, n) + 1, n)
        at = skip_space(s, skip_space(s, key_end, n) + 1, n)
        at = skip_space(s, skip_checked(s, at, n), n)
        if s[at] == 44:
            at = skip_space(s, at + 1, n)
    return at + 1


cdef bint content_parts(Text* text, const unsigned char* s, Py_ssize_t n, Py_ssize_t at) noexcept nogil:
    """A content given as parts: the text of those that are objects, joined."""
    cdef Py_ssize_t text_at, unused, end
    at = skip_space(s, at + 1, n)
    while s[at] != 93:
        if s[at] == 123:
            text_at = unused = -1
            end = object_members(s, n, at, b"text", 4, &text_at, b"", -1, &unused)
            if end == UNSURE:
                return False
            if text_at >= 0 and s[text_at] == 34:  # a part's text that is not a string is none
                decode_string(text, s, n, text_at)
        else:
            end = skip_checked(s, at, n)
        at = skip_space(s, end, n)
        if s[at] == 44:
            at = skip_space(s, at + 1, n)
    return True


cpdef BodyFields scan_body(bytes body):
    """The routed fields of a JSON object body, or None where orjson must decide."""
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t i, key_start, key_end, value_at, model_at = -1
    cdef Py_ssize_t cache_key_at = -1, user_at = -1, messages_at = -1, prompt_at = -1
    cdef Py_ssize_t max_tokens_at = -1, max_completion_at = -1
    cdef Field field
    cdef BodyFields fields
    if n > MAX_SCANNED_BYTES:
        return None
    i = skip_space(s, 0, n)
    if i >= n or s[i] != 123:
        return None
    i = skip_space(s, i + 1, n)
    if i < n and s[i] == 125:
        return None  # no model: orjson's reading gives the refusal
    while True:
        if i >= n or s[i] != 34:
            return None
        key_start = i + 1
        key_end = skip_string(s, i, n)
        if key_end == UNSURE:
            return None
        field = field_named(s + key_start, key_end - 1 - key_start)
        if field == OTHER and has_escape(s, key_start, key_end - 1):
            return None  # an escaped key might spell a routed one
        i = skip_space(s, key_end, n)
        if i >= n or s[i] != 58:
            return None
        value_at = skip_space(s, i + 1, n)
        i = skip_value(s, value_at, n, 1)
        if i == UNSURE:
            return None
        if field == MODEL:
            model_at = value_at
        elif field == PROMPT_CACHE_KEY:
            cache_key_at = value_at
        elif field == USER:
            user_at = value_at
        elif field == MESSAGES:
            messages_at = value_at
        elif field == PROMPT:
            prompt_at = value_at
        elif field == MAX_TOKENS:
            max_tokens_at = value_at
        elif field == MAX_COMPLETION_TOKENS:
            max_completion_at = value_at
        i = skip_space(s, i, n)
        if i >= n:
            return None
        if s[i] == 125:
            break
        if s[i] != 44:
            return None
        i = skip_space(s, i + 1, n)
    if skip_space(s, i + 1, n) != n:
        return None
    # The model: a plain, non-empty string; anything else is refused on orjson's reading.
    if model_at < 0 or s[model_at] != 34 or is_empty_string_at(s, model_at):
        return None
    key_end = skip_string(s, model_at, n)
    if has_escape(s, model_at + 1, key_end - 1):
        return None
    fields = BodyFields.__new__(BodyFields)
    fields.body = body
    fields.model = PyUnicode_DecodeUTF8(<char*>s + model_at + 1, key_end - 2 - model_at, NULL)
    fields.cache_key_at, fields.user_at = cache_key_at, user_at
    fields.messages_at, fields.prompt_at = messages_at, prompt_at
    fields.max_tokens_at, fields.max_completion_at = max_tokens_at, max_completion_at
    return fields

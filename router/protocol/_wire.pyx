# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""HTTP/1.1 read straight from llhttp's C callbacks: no Python call and no Python object per
header, on either side.

- A client's request leaves one `Request`: the method, the target, the few headers the router
  reads (an attribute each), the header lines that go on to the replica (lower-case
  names, hop-by-hop ones dropped) as one bytes object, and the body.
- A replica's answer is told to its connection in three calls at most per read: its head (the
  lines to relay as one bytes object), the body that read brought (one bytes object, framed
  as the client gets it), its end.

llhttp is the parser httptools wraps; it is built into this extension from the pinned source
setup.py fetches. `router.protocol.wire_py` has the same readers on httptools, for
GPUROUTER_NO_EXTENSIONS=1; the differential tests hold the two to the same answers.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdlib cimport calloc, free, realloc
from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcmp, memcpy
from libc.errno cimport EAGAIN, EINTR, errno
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from router.protocol.errors import REASONS, InvalidResponse, RequestRefused
from router.protocol.forwarding import (
    MAX_ANSWER_HEAD_BYTES, NOT_FORWARDED, NOT_RELAYED, ONE_KEY, READ_BY_ROUTER, READ_FIELDS,
    headers_of,
)


cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil


cdef extern from *:
    """
    /* The last `c` in the `size` bytes at `data`: glibc's vectorised memrchr where there is
       one, else a plain loop. */
    #if defined(__GLIBC__)
    #define gf_memrchr(data, c, size) memrchr((data), (c), (size))
    #else
    static const void* gf_memrchr(const void* data, int c, size_t size) {
        const unsigned char* at = (const unsigned char*)data + size;
        while (size--) { if (*--at == (unsigned char)c) return at; }
        return NULL;
    }
    #endif
    """
    const void* gf_memrchr(const void* data, int c, size_t size) noexcept


from router.protocol._llhttp cimport *


# Buffers grow: a request's pieces can arrive over many reads.
cdef char* buffer_extend(Buffer* buffer, Py_ssize_t size) noexcept:
    """Room for `size` (> 0) more bytes at the buffer's end, counted as used; NULL when out
    of memory."""
    cdef Py_ssize_t needed = buffer.size + size
    cdef Py_ssize_t capacity
    cdef char* grown
    if needed > buffer.capacity:
        capacity = max(needed, 2 * buffer.capacity, 256)
        grown = <char*>realloc(buffer.data, capacity)
        if grown == NULL:
            return NULL
        buffer.data = grown
        buffer.capacity = capacity
    buffer.size = needed
    return buffer.data + needed - size


cdef int buffer_add(Buffer* buffer, const char* at, Py_ssize_t size) noexcept:
    if size == 0:  # an empty buffer may have no room at all yet
        return 0
    cdef char* room = buffer_extend(buffer, size)
    if room == NULL:
        return -1
    memcpy(room, at, size)
    return 0


cdef int buffer_add_line(
    Buffer* buffer, const char* name, Py_ssize_t name_size, const char* value, Py_ssize_t size
) noexcept:
    """A header line, "name: value\\r\\n"."""
    cdef char* at = buffer_extend(buffer, name_size + size + 4)
    if at == NULL:
        return -1
    at = put_c(at, name, name_size)
    at = put_c(at, b": ", 2)
    at = put_c(at, value, size)
    put_c(at, b"\r\n", 2)
    return 0


cdef void buffer_reset(Buffer* buffer) noexcept:
    buffer.size = 0
    if buffer.capacity > 65536:  # a large body's room is not kept for the next request
        free(buffer.data)
        buffer.data = NULL
        buffer.capacity = 0


cdef enum:
    MAX_COUNT_DIGITS = 12  # more is no count of tokens


# Header names the router looks at, lower case: whether each is dropped before the replica
# (hop-by-hop, or written by the router) and whether its value is kept for the router to read.
DEF KNOWN_MAX = 32
cdef const char* known_names[KNOWN_MAX]
cdef Py_ssize_t known_sizes[KNOWN_MAX]
cdef bint known_dropped[KNOWN_MAX]
cdef bint known_read[KNOWN_MAX]
cdef int known_count = 0
cdef uint64_t known_size_mask = 0  # bit n: some known name is n bytes long (n < 64)
# The known names by length: known_by_size[known_size_start[n]:][:known_size_count[n]] are the
# indices of those n bytes long, so a name is compared with those of its length alone.
cdef int known_by_size[KNOWN_MAX]
cdef int known_size_start[64]
cdef int known_size_count[64]
cdef int content_length_index = -1
cdef int expect_index = -1
cdef int known_field[KNOWN_MAX]  # of a header the router reads: which Request field; else -1
# The Request fields of the headers the router reads, in the order set_read_header numbers them.
FIELD_ORDER = (
    "authorization", "connection", "content_type", "x_forwarded_for", "x_gpufleet_model",
    "x_request_id", "x_session_id", "traceparent",
)
cdef list method_names = [None] * 256  # bytes per llhttp method number (a byte), made on first use
cdef llhttp_settings_t request_settings
cdef llhttp_settings_t response_settings
cdef const char* HEX_DIGITS = b"0123456789abcdef"
cdef unsigned long long POWERS_OF_TEN[20]
POWERS_OF_TEN[0] = 1
for _power in range(1, 20):
    POWERS_OF_TEN[_power] = POWERS_OF_TEN[_power - 1] * 10
cdef const char* DIGIT_PAIRS = (
    b"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    b"40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    b"8081828384858687888990919293949596979899"
)
cdef const char* LAST_CHUNK = b"0\r\n\r\n"  # ends a chunked body
cdef Py_ssize_t answer_head_limit = MAX_ANSWER_HEAD_BYTES

# The answer's headers the router looks at, lower case: all but content-type are not relayed as
# they came (content-length is written again, as the router frames the answer itself).
cdef const char* answer_names[16]
cdef Py_ssize_t answer_sizes[16]
cdef int answer_count = 0
cdef uint64_t answer_size_mask = 0
cdef int answer_content_length = -1
cdef int answer_transfer_encoding = -1
cdef int answer_content_type = -1
cdef tuple answer_objects


cdef inline uint64_t size_bit(Py_ssize_t size) noexcept:
    return (<uint64_t>1) << size if size < 64 else 0


cdef void learn_names():
    global known_count, content_length_index, expect_index, known_size_mask
    names = tuple(sorted(NOT_FORWARDED | READ_BY_ROUTER))
    assert len(names) <= KNOWN_MAX
    for index, name in enumerate(names):
        known_names[index] = PyBytes_AS_STRING(name)
        known_sizes[index] = PyBytes_GET_SIZE(name)
        known_size_mask |= size_bit(known_sizes[index])
        known_dropped[index] = name in NOT_FORWARDED
        known_read[index] = name in READ_BY_ROUTER
        known_field[index] = FIELD_ORDER.index(READ_FIELDS[name]) if known_read[index] else -1
        if name == b"content-length":
            content_length_index = index
        elif name == b"expect":
            expect_index = index
    known_count = len(names)
    by_size = sorted(range(known_count), key=lambda index: known_sizes[index])
    for position, index in enumerate(by_size):
        size = known_sizes[index]
        assert size < 64
        known_by_size[position] = index
        if known_size_count[size] == 0:
            known_size_start[size] = position
        known_size_count[size] += 1
    global answer_count, answer_content_length, answer_transfer_encoding, answer_content_type
    global answer_objects, answer_size_mask
    answer_objects = tuple(sorted(NOT_RELAYED | {b"content-type"}))
    assert len(answer_objects) <= 16
    for index, name in enumerate(answer_objects):
        answer_names[index] = PyBytes_AS_STRING(name)
        answer_sizes[index] = PyBytes_GET_SIZE(name)
        answer_size_mask |= size_bit(answer_sizes[index])
    answer_count = len(answer_objects)
    answer_content_length = answer_objects.index(b"content-length")
    answer_transfer_encoding = answer_objects.index(b"transfer-encoding")
    answer_content_type = answer_objects.index(b"content-type")


cdef void lower_ascii(char* text, Py_ssize_t size) noexcept:
    """A-Z to a-z in place, 8 bytes at a time: the names of a request's headers."""
    cdef uint64_t word, low7, upper, ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL
    cdef Py_ssize_t at = 0
    cdef char c
    while at + 8 <= size:
        memcpy(&word, text + at, 8)
        low7 = word & ~highs
        # A high bit per byte from "A" on, and from past "Z" on; ASCII bytes alone (~word).
        upper = (low7 + ones * (0x80 - 65)) & ~(low7 + ones * (0x80 - 91)) & ~word & highs
        word |= upper >> 2  # 0x80 >> 2 is 0x20, the case bit
        memcpy(text + at, &word, 8)
        at += 8
    while at < size:
        c = text[at]
        if 65 <= c <= 90:
            text[at] = c + 32
        at += 1


cdef bint same_lower(const char* text, const char* lower, Py_ssize_t size) noexcept:
    """Whether `text` is `lower` in any case (ASCII)."""
    cdef Py_ssize_t at
    cdef char c
    for at in range(size):
        c = text[at]
        if 65 <= c <= 90:
            c += 32
        if c != lower[at]:
            return False
    return True


cdef int answer_index(const char* name, Py_ssize_t size) noexcept:
    """The answer header `name` (any case) in answer_names, or -1."""
    cdef int index
    if not answer_size_mask & size_bit(size):  # most names: no known one is this long
        return -1
    for index in range(answer_count):
        if answer_sizes[index] == size and same_lower(name, answer_names[index], size):
            return index
    return -1


cdef int known_index(const char* name, Py_ssize_t size) noexcept:
    cdef int position, index
    if not known_size_mask & size_bit(size):
        return -1
    for position in range(known_size_start[size], known_size_start[size] + known_size_count[size]):
        index = known_by_size[position]
        if memcmp(known_names[index], name, size) == 0:
            return index
    return -1


cdef bint more_than(const char* digits, Py_ssize_t size, Py_ssize_t limit) noexcept:
    """Whether `digits`, all of them ASCII digits, say a number above `limit`; False when
    they are not all digits (llhttp refuses those itself)."""
    cdef Py_ssize_t value = 0
    cdef Py_ssize_t at
    cdef char c
    if size == 0:
        return False
    for at in range(size):
        c = digits[at]
        if c < 48 or c > 57:
            return False
    for at in range(size):
        value = value * 10 + (digits[at] - 48)
        if value > limit:
            return True
    return False


cdef class Request:
    """One request as the client sent it, read whole."""

    cpdef void bound_completion(self, long long bound):
        """The JSON object body with `"max_tokens": bound` last at its top level (the last of
        a repeated key is the one engines keep): what it was admitted against."""
        self.body = with_max_tokens(self.body, bound)

    def __repr__(self):
        return f"Request({self.method!r}, {self.url!r})"

    @property
    def headers(self):
        """The headers the router reads that the request has, by lower-case name."""
        return headers_of(self)

    cpdef bytes upstream(
        self, bytes path_prefix, bytes host, bytes forward, bytes peer, bytes request_id
    ):
        """The request as it goes to a replica, in one bytes object: `forward`'s header lines,
        then Host, X-Forwarded-For (the client's, extended with `peer`), X-Request-Id and the
        body's length written by the router."""
        cdef char length[24]
        if (
            path_prefix is None or host is None or forward is None or peer is None
            or request_id is None or self.method is None or self.url is None or self.body is None
        ):
            raise TypeError("every piece of a forwarded request is bytes")
        cdef bytes forwarded_for = self.x_forwarded_for
        cdef Py_ssize_t length_size = decimal_digits(length, PyBytes_GET_SIZE(self.body))
        cdef Py_ssize_t size = (
            PyBytes_GET_SIZE(self.method) + 1 + PyBytes_GET_SIZE(path_prefix)
            + PyBytes_GET_SIZE(self.url) + 17 + PyBytes_GET_SIZE(host) + 2
            + PyBytes_GET_SIZE(forward) + 17 + PyBytes_GET_SIZE(peer) + 16
            + PyBytes_GET_SIZE(request_id) + 18 + length_size + 4 + PyBytes_GET_SIZE(self.body)
        )
        if forwarded_for is not None and PyBytes_GET_SIZE(forwarded_for) == 0:
            forwarded_for = None  # an empty one: the peer alone
        if forwarded_for is not None:
            size += PyBytes_GET_SIZE(forwarded_for) + 2
        data = PyBytes_FromStringAndSize(NULL, size)
        cdef char* at = PyBytes_AS_STRING(data)
        at = put(at, self.method)
        at = put_c(at, b" ", 1)
        at = put(at, path_prefix)
        at = put(at, self.url)
        at = put_c(at, b" HTTP/1.1\r\nhost: ", 17)
        at = put(at, host)
        at = put_c(at, b"\r\n", 2)
        at = put(at, forward)
        at = put_c(at, b"x-forwarded-for: ", 17)
        if forwarded_for is not None:
            at = put(at, forwarded_for)
            at = put_c(at, b", ", 2)
        at = put(at, peer)
        at = put_c(at, b"\r\nx-request-id: ", 16)
        at = put(at, request_id)
        at = put_c(at, b"\r\ncontent-length: ", 18)
        at = put_c(at, length, length_size)
        at = put_c(at, b"\r\n\r\n", 4)
        put(at, self.body)
        return data


cdef void set_read_header(Request request, int field, bytes value) noexcept:
    """A header the router reads (the last one of a name wins, as in a dict)."""
    if field == 0:
        request.authorization = value
    elif field == 1:
        request.connection = value
    elif field == 2:
        request.content_type = value
    elif field == 3:
        request.x_forwarded_for = value
    elif field == 4:
        request.x_gpufleet_model = value
    elif field == 5:
        request.x_request_id = value
    elif field == 6:
        request.x_session_id = value
    elif field == 7:
        request.traceparent = value


cdef inline char* put(char* at, bytes piece) noexcept:
    cdef Py_ssize_t size = PyBytes_GET_SIZE(piece)
    memcpy(at, PyBytes_AS_STRING(piece), size)
    return at + size


cdef inline char* put_c(char* at, const char* piece, Py_ssize_t size) noexcept:
    memcpy(at, piece, size)
    return at + size


cpdef double monotonic() noexcept:
    """time.monotonic() as a C call for the compiled modules: the same clock, the same value
    (nanoseconds divided as Python divides them)."""
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return <double>(now.tv_sec * 1000000000 + now.tv_nsec) / 1e9


cdef extern from "<sys/socket.h>" nogil:
    ssize_t send(int fd, const void* buf, size_t n, int flags)
    const int MSG_DONTWAIT
    const int MSG_NOSIGNAL


cpdef Py_ssize_t send_now(int fd, bytes data) except -2:
    """As much of `data` as the socket `fd` takes at once, written from here: how many bytes,
    0 where its buffer is full, -1 on an error (left for the transport to meet and report, as
    it does its own). A C call where a transport's write is a Python call and its own
    bookkeeping; for router/path/sender.py."""
    if data is None:
        raise TypeError("send_now takes bytes")
    cdef ssize_t sent
    while True:
        sent = send(fd, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                    MSG_DONTWAIT | MSG_NOSIGNAL)
        if sent >= 0:
            return sent
        if errno == EINTR:
            continue
        return 0 if errno == EAGAIN else -1  # EWOULDBLOCK is EAGAIN on Linux


cpdef bytes numbered(bytes prefix, Py_ssize_t number):
    """`prefix` then `number` in decimal (not negative), in one allocation: request ids."""
    cdef char digits[24]
    if prefix is None:
        raise TypeError("numbered takes a bytes prefix")
    if number < 0:
        raise ValueError("numbered takes a number that is not negative")
    cdef Py_ssize_t count = decimal_digits(digits, number)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(prefix)
    data = PyBytes_FromStringAndSize(NULL, size + count)
    cdef char* out = PyBytes_AS_STRING(data)
    memcpy(out, PyBytes_AS_STRING(prefix), size)
    memcpy(out + size, digits, count)
    return data


cpdef bytes ratelimit_lines(
    bytes requests_prefix, Py_ssize_t requests_left, Py_ssize_t requests_reset_ms,
    bytes tokens_prefix, Py_ssize_t tokens_left, Py_ssize_t tokens_reset_ms,
):
    """A limited tenant's x-ratelimit-* lines, written on the stack and made one bytes object
    (no formatting on every answer): for each of requests and tokens whose prefix (its
    limit's line and the start of the remaining's) is not empty, the prefix, what is left in
    decimal, and the reset line as OpenAI writes it (250ms, 3s, 6m0s)."""
    cdef char lines[2 * (MAX_RATELIMIT_PREFIX + 128)]
    cdef char* at = lines
    if requests_prefix is None or tokens_prefix is None:
        raise TypeError("ratelimit_lines takes bytes")
    if (PyBytes_GET_SIZE(requests_prefix) > MAX_RATELIMIT_PREFIX
            or PyBytes_GET_SIZE(tokens_prefix) > MAX_RATELIMIT_PREFIX):
        raise ValueError("a ratelimit prefix is one limit's line and a name")
    if PyBytes_GET_SIZE(requests_prefix):
        at = put_ratelimit(at, requests_prefix, requests_left,
                           b"\r\nx-ratelimit-reset-requests: ", RESET_REQUESTS_SIZE,
                           requests_reset_ms)
    if PyBytes_GET_SIZE(tokens_prefix):
        at = put_ratelimit(at, tokens_prefix, tokens_left,
                           b"\r\nx-ratelimit-reset-tokens: ", RESET_TOKENS_SIZE, tokens_reset_ms)
    return PyBytes_FromStringAndSize(lines, at - lines)


cdef inline char* put_ratelimit(char* at, bytes prefix, Py_ssize_t left, const char* reset_name,
                                Py_ssize_t reset_name_size, Py_ssize_t reset_ms) noexcept:
    """One limit's lines: its prefix, what is left, its reset line."""
    at = put(at, prefix)
    at += decimal_digits(at, left if left > 0 else 0)
    memcpy(at, reset_name, reset_name_size)
    at += reset_name_size
    at += reset_text(at, reset_ms)
    at[0] = 13
    at[1] = 10
    return at + 2


cdef enum:
    RESET_REQUESTS_SIZE = 30  # len("\r\nx-ratelimit-reset-requests: ")
    RESET_TOKENS_SIZE = 28
    MAX_RATELIMIT_PREFIX = 160  # a limit's line and the remaining's name: some 70 bytes


cdef inline Py_ssize_t reset_text(char* reset, Py_ssize_t reset_ms) noexcept:
    """A reset as OpenAI writes it: 250ms under a second, else 3s or 6m0s (rounded up)."""
    cdef Py_ssize_t size, seconds
    if reset_ms < 1000:
        size = decimal_digits(reset, reset_ms if reset_ms > 0 else 0)
        reset[size] = 109  # m
        reset[size + 1] = 115  # s
        return size + 2
    seconds = (reset_ms + 999) // 1000
    size = 0
    if seconds >= 60:
        size = decimal_digits(reset, seconds // 60)
        reset[size] = 109  # m
        size += 1
        seconds %= 60
    size += decimal_digits(reset + size, seconds)
    reset[size] = 115  # s
    return size + 1


cpdef bytes with_max_tokens(bytes body, long long bound):
    """`body`, a JSON object, with `"max_tokens": bound` appended at its top level."""
    cdef bytes head = body.rstrip()
    cdef bytes inside = head[:len(head) - 1].rstrip()  # no negative index: wraparound is off
    comma = b"" if inside.endswith(b"{") else b","
    return b"%s%s\"max_tokens\":%d}" % (inside, comma, bound)


cpdef long long number_after(bytes data, bytes name) except -2:
    """The whole number after the last `name:` in `data` (JSON), or -1: a tenant's estimate
    (`max_tokens`) and its engine's `usage`. Scanned from the end, where `usage` is, in C:
    it runs on every answer of a tenant."""
    if data is None or name is None:
        raise TypeError("number_after takes bytes")
    return last_number(
        <const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
        <const unsigned char*>PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name),
    )


cpdef long long usage_tokens(bytes data) except -2:
    """The engine's `usage` in an answer's last bytes: its prompt_tokens times 2**32 plus its
    completion_tokens (the last of each, as number_after finds them), or -1 where either is
    missing or above 2**31. One call on every answer of a tenant, the names in C."""
    if data is None:
        raise TypeError("usage_tokens takes bytes")
    cdef const unsigned char* text = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef long long prompt = last_number(text, size, <const unsigned char*>b'"prompt_tokens"', 15)
    if prompt < 0 or prompt > 0x7FFFFFFF:
        return -1
    cdef long long completion = last_number(
        text, size, <const unsigned char*>b'"completion_tokens"', 19
    )
    if completion < 0 or completion > 0x7FFFFFFF:
        return -1
    return (prompt << 32) | completion


cdef long long last_number(const unsigned char* text, Py_ssize_t size,
                           const unsigned char* key, Py_ssize_t key_size) noexcept:
    """number_after() on C bytes."""
    cdef Py_ssize_t at, digits = 0, scanned = size - key_size + 2
    cdef const unsigned char* second
    cdef long long value = 0
    if key_size < 2 or scanned < 2:
        return -1
    # By the name's second byte (its first, a quote, is every few bytes of JSON).
    while True:
        second = <const unsigned char*>gf_memrchr(text + 1, key[1], scanned - 1)
        if second == NULL:
            return -1
        at = second - 1 - text
        if text[at] == key[0] and memcmp(text + at, key, key_size) == 0:
            break
        scanned = at + 1
    at += key_size
    while at < size and is_json_space(text[at]):
        at += 1
    if at >= size or text[at] != 58:  # :
        return -1
    at += 1
    while at < size and is_json_space(text[at]):
        at += 1
    while at < size and 48 <= text[at] <= 57 and digits < MAX_COUNT_DIGITS:
        value = value * 10 + (text[at] - 48)
        digits += 1
        at += 1
    if digits == 0 or (at < size and 48 <= text[at] <= 57):
        return -1  # none, or too long to be a count of tokens
    return value


cdef inline bint is_json_space(unsigned char c) noexcept:
    return c == 32 or c == 9 or c == 10 or c == 13


cdef Py_ssize_t decimal_digits(char* out, Py_ssize_t value) noexcept:
    """`value` (not negative) in decimal at `out`; returns how many digits. Two digits a
    division, unsigned: a limited tenant's lines hold four numbers of up to nine digits."""
    cdef unsigned long long number = <unsigned long long>value, pair
    # Digits from the bits: 1233/4096 is just over log10(2), off by one at most.
    cdef Py_ssize_t count = ((64 - __builtin_clzll(number | 1)) * 1233) >> 12
    cdef Py_ssize_t at
    if (number | 1) >= POWERS_OF_TEN[count]:  # | 1: 0 has a digit too
        count += 1
    at = count
    while number >= 100:
        pair = (number % 100) * 2
        number //= 100
        at -= 2
        out[at] = DIGIT_PAIRS[pair]
        out[at + 1] = DIGIT_PAIRS[pair + 1]
    if number >= 10:
        out[0] = DIGIT_PAIRS[number * 2]
        out[1] = DIGIT_PAIRS[number * 2 + 1]
    else:
        out[0] = <char>(48 + number)
    return count


cdef Py_ssize_t hex_digits(char* out, Py_ssize_t value) noexcept:
    """`value` (not negative) in lower-case hexadecimal at `out`; returns how many digits."""
    cdef Py_ssize_t count = 1, rest = value >> 4, at
    while rest:
        rest >>= 4
        count += 1
    for at in range(count - 1, -1, -1):
        out[at] = HEX_DIGITS[value & 15]
        value >>= 4
    return count


cdef class RequestReader:
    """Reads the requests of one client connection; each one read whole is appended to
    `pending`. `feed` raises RequestRefused for what the router will not take."""

    def __cinit__(self):
        cdef llhttp_t* parser = <llhttp_t*>calloc(1, sizeof(llhttp_t))
        if parser == NULL:
            raise MemoryError()
        llhttp_init(parser, HTTP_REQUEST, &request_settings)
        parser.data = <void*>self
        self.parser = parser

    def __init__(self, pending, Py_ssize_t max_header_bytes, Py_ssize_t max_body_bytes):
        self.pending = pending
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.mid_message = False
        self.building = None

    def __dealloc__(self):
        free(self.parser)
        free(self.url.data)
        free(self.name.data)
        free(self.value.data)
        free(self.forward.data)
        free(self.body.data)

    cpdef int feed(self, bytes data) except -1:
        """Reads `data`; returns how many requests it completed."""
        self.completed = 0
        cdef llhttp_errno_t error = llhttp_execute(
            <llhttp_t*>self.parser, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)
        )
        if error == HPE_OK:
            return self.completed
        if self.refusal is not None:
            refusal, self.refusal = self.refusal, None
            raise refusal
        if error == HPE_PAUSED_UPGRADE:
            raise RequestRefused(400, "protocol upgrades are not supported")
        reason = llhttp_get_error_reason(<llhttp_t*>self.parser).decode("latin-1")
        raise RequestRefused(400, f"malformed HTTP request: {reason}")

    cdef int refuse(self, int status, str message) noexcept:
        self.refusal = RequestRefused(status, message)
        return -1

    cdef int keep(self, Buffer* buffer, const char* at, Py_ssize_t size) noexcept:
        """A piece of the request's head: counted against the limit, and kept."""
        self.header_bytes += size
        if self.header_bytes > self.max_header_bytes:
            return self.refuse(431, "request headers are too large")
        if buffer_add(buffer, at, size):
            return self.refuse(503, "the router is out of memory")
        return 0

    cdef int take_header(self) except -1:
        """The header just read, sorted: kept by name, forwarded as a line, or both. 1 when
        it refuses the request."""
        cdef Buffer* name = &self.name
        cdef Buffer* value = &self.value
        cdef int index
        cdef llhttp_t* parser
        lower_ascii(name.data, name.size)
        index = known_index(name.data, name.size)
        if index >= 0:
            if known_read[index]:
                if self.building is None:
                    self.building = Request.__new__(Request)
                elif known_field[index] == 0 and self.building.authorization is not None:
                    self.refuse(400, ONE_KEY)
                    return 1
                set_read_header(
                    self.building, known_field[index],
                    PyBytes_FromStringAndSize(value.data, value.size),
                )
            if index == content_length_index and more_than(
                value.data, value.size, self.max_body_bytes
            ):
                self.refuse(413, "request body is too large")
                return 1
            if index == expect_index and value.size == 12 and same_lower(
                value.data, b"100-continue", 12
            ):
                parser = <llhttp_t*>self.parser
                # HTTP/1.0 clients cannot take an interim answer (RFC 9110, 10.1.1).
                self.continue_wanted = parser.http_major > 1 or parser.http_minor >= 1
            if known_dropped[index]:
                name.size = value.size = 0
                return 0
        if buffer_add_line(&self.forward, name.data, name.size, value.data, value.size):
            self.refuse(503, "the router is out of memory")
            return 1
        name.size = value.size = 0
        return 0

    cdef int take_request(self) except -1:
        cdef Request request = self.building
        cdef int method = (<llhttp_t*>self.parser).method
        cdef const char* query
        if request is None:
            request = Request.__new__(Request)
        self.building = None
        name = method_names[method]
        if name is None:
            name = method_names[method] = <bytes>llhttp_method_name(<llhttp_method_t>method)
        request.method = name
        request.url = PyBytes_FromStringAndSize(self.url.data, self.url.size)
        query = <const char*>memchr(self.url.data, 63, self.url.size)  # "?"
        if query == NULL:
            request.path = request.url
        else:
            request.path = PyBytes_FromStringAndSize(self.url.data, query - self.url.data)
        request.forward = PyBytes_FromStringAndSize(self.forward.data, self.forward.size)
        request.body = PyBytes_FromStringAndSize(self.body.data, self.body.size)
        request.keep_alive = llhttp_should_keep_alive(<llhttp_t*>self.parser)
        self.pending.append(request)
        self.completed += 1
        self.mid_message = self.continue_wanted = False
        return 0


cdef class ResponseReader:
    """Reads the answers of one replica connection and tells `sink` (an AnswerSink) of each:
    - `sink.answer_head(status)` once the head is read: `length_given` and `sse` say what the
      head said, `relay_head()` sends the client its head;
    - `sink.answer_body(data)` at most once per read, with all that read brought for the
      client, framed as the client is to get it: the relayed head, the body (in chunks of its
      own when the answer has no length: each piece the replica sent becomes one chunk) and,
      at the end of a chunked one, the last chunk;
    - `sink.answer_complete(keep_alive)` at its end (`feed_eof` ends an answer whose body runs
      to the close).
    Interim answers (1xx but 101) are read and dropped. `feed` raises InvalidResponse for what
    is not HTTP."""

    cpdef void relay_head(self, bytes request_id, bint close, bytes extra=b"") except *:
        """The head the client gets goes out ahead of the body: in the same `answer_body` as
        the body this read brings, or alone at the end of the read when it brought none. It
        is the replica's status line (its reason, or the usual one), the relayed lines,
        chunked framing when the answer has no length, `connection: close` when the client's
        connection ends with it, the router's own `extra` lines (each ending in CRLF), and the
        request id."""
        if request_id is None or extra is None:
            raise TypeError("the request id and extra lines are bytes")
        cdef char* room = buffer_extend(
            &self.body, self.client_head_size(request_id, close) + PyBytes_GET_SIZE(extra)
        )
        if room == NULL:
            raise MemoryError()
        self.write_client_head(room, request_id, close, extra)

    cdef Py_ssize_t client_head_size(self, bytes request_id, bint close) noexcept:
        cdef Py_ssize_t reason_size = self.reason.size
        if reason_size == 0:
            reason_size = PyBytes_GET_SIZE(<bytes>REASONS.get(self.status, b""))
        return (
            9 + 3 + 1 + reason_size + 2 + self.relayed.size
            + (0 if self.length_given else 28) + (19 if close else 0)
            + 14 + PyBytes_GET_SIZE(request_id) + 4
        )

    cdef void write_client_head(self, char* at, bytes request_id, bint close, bytes extra) noexcept:
        at = put_c(at, b"HTTP/1.1 ", 9)
        at[0] = 48 + self.status // 100  # llhttp reads three digits: 100 to 999
        at[1] = 48 + self.status // 10 % 10
        at[2] = 48 + self.status % 10
        at += 3
        at = put_c(at, b" ", 1)
        if self.reason.size == 0:
            at = put(at, <bytes>REASONS.get(self.status, b""))
        else:
            at = put_c(at, self.reason.data, self.reason.size)
        at = put_c(at, b"\r\n", 2)
        at = put_c(at, self.relayed.data, self.relayed.size)
        if not self.length_given:
            at = put_c(at, b"transfer-encoding: chunked\r\n", 28)
        if close:
            at = put_c(at, b"connection: close\r\n", 19)
        at = put(at, extra)
        at = put_c(at, b"x-request-id: ", 14)
        at = put(at, request_id)
        put_c(at, b"\r\n\r\n", 4)

    cpdef bint feed_eof(self) except -1:
        """The replica closed the connection: an answer whose body runs to the close (neither
        length nor chunks) is complete, and True; any other is not, and nothing is told."""
        if not self.headers_done or self.framed:
            return False
        self.headers_done = False
        if buffer_add(&self.body, LAST_CHUNK, 5):
            raise MemoryError()
        self.pass_body()
        self.sink.answer_complete(False)
        return True

    def __cinit__(self):
        cdef llhttp_t* parser = <llhttp_t*>calloc(1, sizeof(llhttp_t))
        if parser == NULL:
            raise MemoryError()
        llhttp_init(parser, HTTP_RESPONSE, &response_settings)
        parser.data = <void*>self
        self.parser = parser

    def __init__(self, AnswerSink sink not None):
        self.sink = sink

    def __dealloc__(self):
        free(self.parser)
        free(self.reason.data)
        free(self.name.data)
        free(self.value.data)
        free(self.relayed.data)
        free(self.body.data)

    cpdef int feed(self, bytes data) except -1:
        cdef llhttp_errno_t error = llhttp_execute(
            <llhttp_t*>self.parser, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)
        )
        if self.body.size and self.failure is None:
            try:
                self.pass_body()
            except BaseException as exc:
                self.failure = exc
        if error == HPE_OK and self.failure is None:
            return 0
        if self.failure is not None:
            failure, self.failure = self.failure, None
            if isinstance(failure, InvalidResponse):
                raise failure
            raise InvalidResponse("the router failed on this answer") from failure
        raise InvalidResponse(llhttp_get_error_reason(<llhttp_t*>self.parser).decode("latin-1"))

    cdef int keep_head(self, Buffer* buffer, const char* at, Py_ssize_t size) noexcept:
        """A piece of the answer's head: counted against MAX_ANSWER_HEAD_BYTES, and kept."""
        self.head_bytes += size
        if self.head_bytes > answer_head_limit:
            self.failure = InvalidResponse(
                f"the answer's head is larger than {MAX_ANSWER_HEAD_BYTES} bytes"
            )
            return -1
        return buffer_add(buffer, at, size)

    cdef int pass_body(self) except -1:
        """The body read so far goes to the sink, in one bytes object."""
        data = PyBytes_FromStringAndSize(self.body.data, self.body.size)
        buffer_reset(&self.body)
        self.sink.answer_body(data)
        return 0

    cdef int keep_body(self, const char* at, Py_ssize_t size) noexcept:
        """A piece of the body, kept as the client will get it."""
        cdef char size_line[24]  # the chunk's size: hex digits, then CRLF
        cdef Py_ssize_t digits
        if self.length_given:
            return buffer_add(&self.body, at, size)
        digits = hex_digits(size_line, size)
        size_line[digits] = 13
        size_line[digits + 1] = 10
        if (
            buffer_add(&self.body, size_line, digits + 2)
            or buffer_add(&self.body, at, size)
            or buffer_add(&self.body, b"\r\n", 2)
        ):
            return -1
        return 0

    cdef int take_header(self) noexcept:
        cdef Buffer* name = &self.name
        cdef Buffer* value = &self.value
        cdef int index = answer_index(name.data, name.size)
        cdef int failed = 0
        if index == answer_content_length:
            self.framed = self.length_given = True
            failed = buffer_add_line(&self.relayed, b"content-length", 14, value.data, value.size)
        elif index == answer_transfer_encoding:
            self.framed = True
        elif index < 0 or index == answer_content_type:  # relayed as it came
            if index == answer_content_type and value.size >= 17:
                self.sse = self.sse or memcmp(value.data, b"text/event-stream", 17) == 0
            failed = buffer_add_line(&self.relayed, name.data, name.size, value.data, value.size)
        name.size = value.size = 0
        return -1 if failed else 0


# llhttp's callbacks: C functions that find their reader in parser.data (cast in place where a
# callback is one call: a typed local would add a reference count per piece of a head). A
# non-zero return stops the parser; `feed` then raises the refusal the reader recorded.

cdef int on_message_begin(llhttp_t* parser) noexcept:
    cdef RequestReader reader = <RequestReader>parser.data
    buffer_reset(&reader.url)
    buffer_reset(&reader.forward)
    buffer_reset(&reader.body)
    reader.name.size = reader.value.size = 0
    reader.header_bytes = reader.body_bytes = 0
    reader.building = None
    reader.mid_message = True
    reader.continue_wanted = False
    return 0


cdef int on_url(llhttp_t* parser, const char* at, size_t size) noexcept:
    return (<RequestReader>parser.data).keep(&(<RequestReader>parser.data).url, at, size)


cdef int on_header_field(llhttp_t* parser, const char* at, size_t size) noexcept:
    return (<RequestReader>parser.data).keep(&(<RequestReader>parser.data).name, at, size)


cdef int on_header_value(llhttp_t* parser, const char* at, size_t size) noexcept:
    return (<RequestReader>parser.data).keep(&(<RequestReader>parser.data).value, at, size)


cdef int on_header_value_complete(llhttp_t* parser) noexcept:
    cdef RequestReader reader = <RequestReader>parser.data
    try:
        return -1 if reader.take_header() else 0
    except BaseException:
        return reader.refuse(400, "malformed HTTP request")


cdef int on_headers_complete(llhttp_t* parser) noexcept:
    return 1 if parser.upgrade else 0  # an upgrade has no body: feed refuses it next


cdef int on_body(llhttp_t* parser, const char* at, size_t size) noexcept:
    cdef RequestReader reader = <RequestReader>parser.data
    reader.body_bytes += size
    if reader.body_bytes > reader.max_body_bytes:
        return reader.refuse(413, "request body is too large")
    if buffer_add(&reader.body, at, size):
        return reader.refuse(503, "the router is out of memory")
    return 0


cdef int on_message_complete(llhttp_t* parser) noexcept:
    cdef RequestReader reader = <RequestReader>parser.data
    try:
        return -1 if reader.take_request() else 0
    except BaseException:
        return reader.refuse(400, "malformed HTTP request")


cdef int answer_begins(llhttp_t* parser) noexcept:
    cdef ResponseReader reader = <ResponseReader>parser.data
    reader.reason.size = reader.name.size = reader.value.size = 0
    reader.head_bytes = 0
    buffer_reset(&reader.relayed)
    reader.length_given = reader.sse = reader.headers_done = reader.framed = False
    reader.body_begun = False
    return 0


cdef int answer_reason(llhttp_t* parser, const char* at, size_t size) noexcept:
    return (<ResponseReader>parser.data).keep_head(&(<ResponseReader>parser.data).reason, at, size)


cdef int answer_header_name(llhttp_t* parser, const char* at, size_t size) noexcept:
    return (<ResponseReader>parser.data).keep_head(&(<ResponseReader>parser.data).name, at, size)


cdef int answer_header_value(llhttp_t* parser, const char* at, size_t size) noexcept:
    return (<ResponseReader>parser.data).keep_head(&(<ResponseReader>parser.data).value, at, size)


cdef int answer_header_done(llhttp_t* parser) noexcept:
    return (<ResponseReader>parser.data).take_header()


cdef int answer_head_done(llhttp_t* parser) noexcept:
    cdef ResponseReader reader = <ResponseReader>parser.data
    if 100 <= parser.status_code < 200 and parser.status_code != 101:
        # An interim answer (100 Continue, 103 Early Hints): the answer is still to come.
        reader.interim = True
        return 0
    try:
        reader.headers_done = True
        reader.status = parser.status_code
        reader.sink.answer_head(reader.status)
    except BaseException as exc:
        reader.failure = exc
        return -1
    return 1 if parser.upgrade else 0


cdef int answer_body(llhttp_t* parser, const char* at, size_t size) noexcept:
    if size == 0:
        return 0
    (<ResponseReader>parser.data).body_begun = True
    return (<ResponseReader>parser.data).keep_body(at, size)


cdef int answer_done(llhttp_t* parser) noexcept:
    cdef ResponseReader reader = <ResponseReader>parser.data
    if reader.interim:
        reader.interim = False
        return 0
    try:
        if not reader.length_given and buffer_add(&reader.body, LAST_CHUNK, 5):
            raise MemoryError()
        if reader.body.size:
            reader.pass_body()
        reader.sink.answer_complete(llhttp_should_keep_alive(parser))
    except BaseException as exc:
        reader.failure = exc
        return -1
    return 0


learn_names()
llhttp_settings_init(&request_settings)
request_settings.on_message_begin = on_message_begin
request_settings.on_url = on_url
request_settings.on_header_field = on_header_field
request_settings.on_header_value = on_header_value
request_settings.on_header_value_complete = on_header_value_complete
request_settings.on_headers_complete = on_headers_complete
request_settings.on_body = on_body
request_settings.on_message_complete = on_message_complete

llhttp_settings_init(&response_settings)
response_settings.on_message_begin = answer_begins
response_settings.on_status = answer_reason
response_settings.on_header_field = answer_header_name
response_settings.on_header_value = answer_header_value
response_settings.on_header_value_complete = answer_header_done
response_settings.on_headers_complete = answer_head_done
response_settings.on_body = answer_body
response_settings.on_message_complete = answer_done

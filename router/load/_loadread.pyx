# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""An engine's load page read in C: the answer to GET /metrics framed by llhttp, and only the
series the router needs found in its body, line by line, without a Python object per line.

`PageReader` reads the answers of one kept-alive connection, one at a time: `feed` the bytes
as they come (NEED_MORE, COMPLETE, TOO_LARGE once the body passes `max_bytes`, NOT_HTTP), then
read `status`, `keep_alive` and `reading()`; `next()` before the next answer. `scan_load(page)`
is the scan alone. router/load/loadread_py.py is the twin in Python; router/load/loadseries.py names the
series for both.

A sample line is NAME, optional {labels} (quoted values may hold braces and escaped quotes),
blanks, the value, and an optional timestamp, which is never taken for the value. A value is
taken only if it is made of digits, signs, points and exponents, and parses whole as a number:
NaN, Inf, hex and words are bad readings, as a negative number is.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.math cimport isfinite
from libc.stdlib cimport calloc, free, malloc, realloc, strtod
from libc.string cimport memchr, memcmp, memcpy

from router.protocol._llhttp cimport *
from router.load.loadseries import COMPLETE, NEED_MORE, NOT_HTTP, SERIES, TOO_LARGE, BadReading, Reading

cdef enum:
    # as router/load/loadseries.py numbers them (checked below)
    S_NEED_MORE = 0
    S_COMPLETE = 1
    S_TOO_LARGE = 2
    S_NOT_HTTP = 3
    FIELD_WAITING = 0
    FIELD_RUNNING = 1
    FIELD_KV = 2
    MOST_NAMES = 32
    VALUE_MOST = 63  # characters of a value: more is not a number a gauge holds

cdef struct Series:
    const char* name
    Py_ssize_t size
    int field

if (NEED_MORE, COMPLETE, TOO_LARGE, NOT_HTTP) != (S_NEED_MORE, S_COMPLETE, S_TOO_LARGE, S_NOT_HTTP):
    raise ImportError("router.load._loadread numbers its outcomes unlike router.load.loadseries")

cdef Series series[MOST_NAMES]
cdef int series_count = 0
cdef list kept_names = []  # the names' bytes, alive as long as the module
cdef unsigned char first_chars[256]  # 1 for a character a known name starts with

for _name, _field in SERIES.items():
    if series_count == MOST_NAMES:
        raise ImportError("too many load series for router.load._loadread")
    kept_names.append(_name)
    series[series_count].name = PyBytes_AS_STRING(_name)
    series[series_count].size = PyBytes_GET_SIZE(_name)
    series[series_count].field = _field
    first_chars[<unsigned char>_name[0]] = 1
    series_count += 1


cdef inline bint is_blank(char c) noexcept:
    return c == b' ' or c == b'\t'


cdef inline bint is_space(char c) noexcept:
    """What ends a value: the white space of a regular expression's \\s, but the newline."""
    return c == b' ' or c == b'\t' or c == b'\r' or c == b'\x0b' or c == b'\x0c'


cdef const char* after_labels(const char* at, const char* end) noexcept:
    """Past the label set that starts at `at` ('{'); NULL when it does not close on its line."""
    cdef bint quoted = False
    at += 1
    while at < end:
        if quoted:
            if at[0] == b'\\':
                at += 1
            elif at[0] == b'"':
                quoted = False
        elif at[0] == b'"':
            quoted = True
        elif at[0] == b'}':
            return at + 1
        at += 1
    return NULL


cdef int value_of(const char* at, Py_ssize_t size, double* value) noexcept:
    """0 and the value when the token is a finite number; -1 when it is not."""
    cdef char text[VALUE_MOST + 1]
    cdef char* stop
    cdef Py_ssize_t i
    cdef char c
    if size == 0 or size > VALUE_MOST:
        return -1
    for i in range(size):
        c = at[i]
        if not (b'0' <= c <= b'9' or c == b'.' or c == b'e' or c == b'E' or c == b'+' or c == b'-'):
            return -1
        text[i] = c
    text[size] = 0
    value[0] = strtod(text, &stop)
    if stop != text + size or not isfinite(value[0]):
        return -1
    return 0


cdef int scan(
    const char* data, Py_ssize_t size, double* totals, Py_ssize_t* bad_at, Py_ssize_t* bad_size
) noexcept:
    """Adds the known series of the page to `totals`: 1 if it named one, 0 if none, -1 (and
    where) at a value that is not a finite non-negative number."""
    cdef const char* at = data
    cdef const char* end = data + size
    cdef const char* line_end
    cdef const char* p
    cdef const char* token
    cdef int k, found = 0
    cdef double value
    while at < end:
        line_end = <const char*>memchr(at, b'\n', end - at)
        if line_end == NULL:
            line_end = end
        if first_chars[<unsigned char>at[0]]:
            for k in range(series_count):
                if (
                    line_end - at > series[k].size
                    and memcmp(at, series[k].name, series[k].size) == 0
                ):
                    p = at + series[k].size
                    if p[0] == b'{':
                        p = after_labels(p, line_end)
                        if p == NULL:
                            break
                    if p >= line_end or not is_blank(p[0]):
                        continue  # a longer name that starts with this one
                    while p < line_end and is_blank(p[0]):
                        p += 1
                    token = p
                    while p < line_end and not is_space(p[0]):
                        p += 1
                    if value_of(token, p - token, &value) or value < 0:
                        bad_at[0] = token - data
                        bad_size[0] = min(p - token, 20)
                        return -1
                    if series[k].field == FIELD_KV:
                        if value > totals[FIELD_KV]:
                            totals[FIELD_KV] = value
                    else:
                        totals[series[k].field] += value
                    found = 1
                    break
        at = line_end + 1
    return found


cdef object reading_from(const char* data, Py_ssize_t size):
    cdef double totals[3]
    cdef Py_ssize_t bad_at = 0, bad_size = 0
    totals[0] = totals[1] = totals[2] = 0.0
    cdef int found = scan(data, size, totals, &bad_at, &bad_size)
    if found < 0:
        raise BadReading(f"not a finite non-negative number: {data[bad_at:bad_at + bad_size]!r}")
    if not found:
        return None
    return Reading(<long long>totals[FIELD_WAITING], <long long>totals[FIELD_RUNNING],
                   min(totals[FIELD_KV], 1.0))


cpdef object scan_load(bytes page):
    """The load a Prometheus text page gives (a Reading), looking only for the known series;
    None when it names none of them; BadReading when one's value is not a finite
    non-negative number."""
    return reading_from(PyBytes_AS_STRING(page), PyBytes_GET_SIZE(page))


cdef llhttp_settings_t page_settings


cdef int on_headers_complete(llhttp_t* parser) noexcept:
    (<PageReader>parser.data).status = parser.status_code
    return 0


cdef int on_body(llhttp_t* parser, const char* at, size_t size) noexcept:
    cdef PageReader reader = <PageReader>parser.data
    cdef Py_ssize_t needed = reader.size + <Py_ssize_t>size
    cdef char* grown
    if needed > reader.max_bytes:
        reader.state = S_TOO_LARGE
        return -1
    if needed > reader.capacity:
        grown = <char*>realloc(reader.body, max(needed, 2 * reader.capacity, 4096))
        if grown == NULL:
            reader.state = S_NOT_HTTP
            return -1
        reader.body = grown
        reader.capacity = max(needed, 2 * reader.capacity, 4096)
    memcpy(reader.body + reader.size, at, size)
    reader.size = needed
    return 0


cdef int on_message_complete(llhttp_t* parser) noexcept:
    cdef PageReader reader = <PageReader>parser.data
    reader.keep_alive = llhttp_should_keep_alive(parser)
    reader.state = S_COMPLETE
    return 0


llhttp_settings_init(&page_settings)
page_settings.on_headers_complete = on_headers_complete
page_settings.on_body = on_body
page_settings.on_message_complete = on_message_complete


cdef class PageReader:
    cdef llhttp_t* parser
    cdef char* body
    cdef Py_ssize_t size, capacity
    cdef readonly Py_ssize_t max_bytes
    cdef readonly int status
    cdef readonly bint keep_alive
    cdef int state

    def __cinit__(self, Py_ssize_t max_bytes):
        self.parser = <llhttp_t*>calloc(1, sizeof(llhttp_t))
        if self.parser == NULL:
            raise MemoryError()
        llhttp_init(self.parser, HTTP_RESPONSE, &page_settings)
        self.parser.data = <void*>self
        self.max_bytes = max_bytes
        self.state = S_NEED_MORE

    def __dealloc__(self):
        free(self.parser)
        free(self.body)

    cpdef int feed(self, bytes data) except -1:
        if self.state != S_NEED_MORE:
            return S_NOT_HTTP  # bytes nobody asked for
        cdef llhttp_errno_t error = llhttp_execute(
            self.parser, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)
        )
        if self.state != S_NEED_MORE:
            return self.state
        return S_NEED_MORE if error == HPE_OK else S_NOT_HTTP

    cpdef int feed_eof(self) except -1:
        """The engine closed the connection: an answer whose body ran to the close is
        complete."""
        if self.state == S_NEED_MORE and self.status:
            llhttp_finish(self.parser)
        return S_COMPLETE if self.state == S_COMPLETE else S_NOT_HTTP

    cpdef void next(self) noexcept:
        self.state = S_NEED_MORE
        self.status = 0
        self.size = 0
        if self.capacity > 65536:  # a large page's room is not kept for the small ones
            free(self.body)
            self.body = NULL
            self.capacity = 0

    cpdef object reading(self):
        return reading_from(self.body, self.size)

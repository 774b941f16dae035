# The request reader's C-level types: front.py (compiled) reads a Request's fields directly.

from router.protocol.sink cimport AnswerSink


cdef struct Buffer:
    char* data
    Py_ssize_t size
    Py_ssize_t capacity


cdef class Request:
    cdef readonly bytes method
    cdef readonly bytes url
    cdef readonly bytes path  # the url without its query
    # The headers the router reads (forwarding.READ_FIELDS); None when the request has none.
    cdef readonly bytes authorization, connection, content_type, x_forwarded_for
    cdef readonly bytes x_gpufleet_model, x_request_id, x_session_id, traceparent
    cdef readonly bytes forward
    cdef readonly bytes body
    cdef readonly bint keep_alive

    cpdef bytes upstream(self, bytes path_prefix, bytes host, bytes forward, bytes peer, bytes request_id)
    cpdef void bound_completion(self, long long bound)


cdef class RequestReader:
    cdef void* parser  # an llhttp_t, opaque here: modules that cimport this need no llhttp.h
    cdef Buffer url, name, value, forward, body
    cdef list pending
    cdef Py_ssize_t max_header_bytes, max_body_bytes, header_bytes, body_bytes
    cdef Request building  # the request being read, made at its first header the router reads
    cdef readonly bint mid_message
    cdef public bint continue_wanted  # the request being read expects 100 Continue
    cdef int completed
    cdef object refusal

    cpdef int feed(self, bytes data) except -1
    cdef int refuse(self, int status, str message) noexcept
    cdef int keep(self, Buffer* buffer, const char* at, Py_ssize_t size) noexcept
    cdef int take_header(self) except -1
    cdef int take_request(self) except -1


cdef class ResponseReader:
    cdef void* parser
    cdef Buffer reason, name, value, relayed, body
    cdef AnswerSink sink
    cdef readonly int status
    cdef readonly bint length_given, sse, headers_done, framed
    cdef readonly bint body_begun  # some of this answer's body has been read
    cdef bint interim
    cdef Py_ssize_t head_bytes
    cdef object failure

    cpdef int feed(self, bytes data) except -1
    cpdef void relay_head(self, bytes request_id, bint close, bytes extra=*) except *
    cdef Py_ssize_t client_head_size(self, bytes request_id, bint close) noexcept
    cdef void write_client_head(self, char* at, bytes request_id, bint close, bytes extra) noexcept
    cpdef bint feed_eof(self) except -1
    cdef int pass_body(self) except -1
    cdef int keep_head(self, Buffer* buffer, const char* at, Py_ssize_t size) noexcept
    cdef int keep_body(self, const char* at, Py_ssize_t size) noexcept
    cdef int take_header(self) noexcept


cpdef bytes numbered(bytes prefix, Py_ssize_t number)
cpdef bytes ratelimit_lines(bytes requests_prefix, Py_ssize_t requests_left, Py_ssize_t requests_reset_ms, bytes tokens_prefix, Py_ssize_t tokens_left, Py_ssize_t tokens_reset_ms)
cpdef long long number_after(bytes data, bytes name) except -2
cpdef long long usage_tokens(bytes data) except -2
cpdef double monotonic() noexcept
cpdef Py_ssize_t send_now(int fd, bytes data) except -2


cpdef bytes with_max_tokens(bytes body, long long bound)

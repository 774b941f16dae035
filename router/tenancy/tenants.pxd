# Types of router/tenancy/tenants.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router.protocol._bodyscan cimport BodyFields
from router.protocol._wire cimport ratelimit_lines


cdef class Bucket:
    cdef public double per_minute
    cdef public double level
    cdef public double at
    cdef public double least

    @cython.locals(most=double, elapsed=double)
    cpdef void fill(self, double per_minute, double now) except *
    cpdef double wait_for(self, double need) except -1


cdef class UsageRow:
    cdef public double requests
    cdef public double errors
    cdef public double rate_limited
    cdef public double prompt_tokens
    cdef public double completion_tokens
    cdef public double queue_wait_s
    cdef public long ok
    cdef public dict codes


cdef class TenantState:
    cdef public str name
    cdef public tuple patterns
    cdef public dict allowed
    cdef public double requests_per_minute
    cdef public double tokens_per_minute
    cdef public long max_in_flight
    cdef public double weight
    cdef public long priority
    cdef public long default_max_tokens
    cdef public bint limited
    cdef public Bucket requests
    cdef public Bucket tokens
    cdef public long in_flight
    cdef public long wanted_in_flight
    cdef public double demand_requests
    cdef public double demand_tokens
    cdef public dict usage
    cdef str last_model
    cdef UsageRow last_row
    cdef public dict waits
    cdef public double created
    cdef public bytes requests_prefix
    cdef public bytes tokens_prefix
    cdef public double share_requests, share_tokens, floor_requests, floor_tokens
    cdef public long share_in_flight, floor_in_flight
    cdef public long waiting
    cdef public bint named, spare_requests, spare_tokens
    cdef public object shared
    cdef public long shared_cell
    cdef public long shared_held
    cdef bytes said_lines
    cdef Py_ssize_t said_requests_left, said_requests_reset, said_tokens_left, said_tokens_reset

    cpdef bint may_call(self, str model) except -1
    @cython.locals(asking=long)
    cpdef int admit(self, double now, double tokens, bint leased) except -1
    cpdef int take(self, double now, double tokens, bint leased) except -1
    cpdef bint may_wait(self, int refused) except -1
    @cython.locals(requests=double, tokens_share=double, most=long)
    cdef int _take(self, double now, double tokens, bint leased) except -1
    cpdef double retry_after(self, int refused) except -1
    cpdef void settle(self, double reserved, double used) except *
    @cython.locals(row=UsageRow)
    cpdef void count(self, str model, int status, long prompt, long completion, bint refused, double waited) except *
    @cython.locals(requests_left=Py_ssize_t, requests_reset=Py_ssize_t, tokens_left=Py_ssize_t, tokens_reset=Py_ssize_t)
    cpdef bytes limit_headers(self)
    cdef void _forget_lines(self) noexcept


cdef class TenantBook:
    cdef public dict by_digest
    cdef public dict tenants
    cdef public set keys_used
    cdef public double share_lease_s
    cdef public double lease_until
    cdef public dict file_keys
    cdef public dict known
    cdef public bytes last_authorization
    cdef public tuple last_found
    cdef public bint last_marked
    cdef public bint required
    cdef public object shared_in_flight

    @cython.locals(found=tuple)
    cpdef TenantState find(self, bytes authorization)


@cython.locals(fields=BodyFields)
cpdef long long completion_bound(object payload) except -3
@cython.locals(per_token=Py_ssize_t)
cpdef long long tokens_asked(Py_ssize_t body_bytes, long long bound) except -1
cdef Py_ssize_t _left(Bucket bucket)
cdef Py_ssize_t _reset_ms(Bucket bucket)

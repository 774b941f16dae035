# Types of router/tenants.py when compiled (Cython's pure Python mode): the .py is the code.


cdef class Bucket:
    cdef public double per_minute
    cdef public double level
    cdef public double at

    cpdef void fill(self, double per_minute, double now) except *
    cpdef double wait_for(self, double need) except -1


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
    cdef public tuple share
    cdef public tuple floor
    cdef public Bucket requests
    cdef public Bucket tokens
    cdef public long in_flight
    cdef public double demand_requests
    cdef public double demand_tokens
    cdef public dict usage
    cdef public dict codes
    cdef public dict waits
    cdef public double created

    cpdef bint may_call(self, str model) except -1
    cpdef int admit(self, double now, double tokens, bint leased) except -1
    cpdef void settle(self, double reserved, double used) except *


cdef class TenantBook:
    cdef public dict by_digest
    cdef public dict tenants
    cdef public dict keys_used
    cdef public double share_lease_s
    cdef public double lease_until
    cdef public dict file_keys

    cpdef object find(self, object authorization)

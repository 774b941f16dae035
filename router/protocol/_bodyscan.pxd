# The body scanner's C-level types: target.py and affinity.py (compiled) use them directly.


cdef class BodyFields:
    cdef readonly str model
    cdef readonly bytes body
    # Where each routed field's value begins in the body; -1: absent.
    cdef Py_ssize_t cache_key_at, user_at, messages_at, prompt_at
    cdef Py_ssize_t max_tokens_at, max_completion_at

    cpdef object loaded(self)
    cpdef long long completion_bound(self)
    cpdef long long affinity_key(self, bytes session_header, bint by_prefix, Py_ssize_t prefix_chars) except -2


cpdef BodyFields scan_body(bytes body)

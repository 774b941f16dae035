# Types of router/front.py when compiled (Cython's pure Python mode): the .py is the code.

from router.exchange cimport Exchange


cdef class ClientConnection:
    cdef public object ctx
    cdef public object transport
    cdef public object parser
    cdef public bytes peer
    cdef public object pending
    cdef public Exchange exchange
    cdef public bint closed
    cdef public double idle_since
    cdef public bint keep_alive
    cdef public Py_ssize_t max_header_bytes
    cdef public Py_ssize_t max_body_bytes
    cdef public double reading_since
    cdef public bytes url
    cdef public dict headers
    cdef public list forward_lines
    cdef public Py_ssize_t header_bytes
    cdef public list body
    cdef public Py_ssize_t body_bytes

    cpdef void next_request(self) except *
    cpdef void respond(self, int status, bytes body, bytes request_id=*, bytes extra=*, bytes content_type=*) except *
    cpdef void request_done(self, double now) except *
    cpdef void close(self)

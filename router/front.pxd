# Types of router/front.py when compiled (Cython's pure Python mode): the .py is the code.

from router.context cimport ProxyContext
from router.exchange cimport ClientSide, Exchange


cdef class ClientConnection(ClientSide):
    cdef public object parser
    cdef public object pending
    cdef public double idle_since
    cdef public Py_ssize_t max_header_bytes
    cdef public Py_ssize_t max_body_bytes
    cdef public double reading_since
    cdef public bytes url
    cdef public dict headers
    cdef public list forward_lines
    cdef public Py_ssize_t header_bytes
    cdef public list body
    cdef public Py_ssize_t body_bytes

    cpdef void on_header(self, bytes name, bytes value) except *
    cpdef void on_body(self, bytes body) except *
    cpdef void next_request(self) except *
    cpdef void respond(self, int status, bytes body, bytes request_id=*, bytes extra=*, bytes content_type=*) except *
    cpdef void request_done(self, double now) except *
    cpdef void close(self)

# Types of router/path/front.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router.path cimport affinity, target

from router.protocol cimport _wire
from router.protocol._wire cimport monotonic
from router.path.context cimport ProxyContext
from router.path.exchange cimport ClientSide, Exchange
from router.tenancy.tenants cimport TenantState, completion_bound, tokens_asked


cdef class ClientConnection(ClientSide):
    cdef public _wire.RequestReader reader
    cdef public list pending
    cdef public double idle_since
    cdef public double reading_since

    @cython.locals(completed=int)
    cpdef void data_received(self, bytes data) except *
    @cython.locals(request=_wire.Request, exchange=Exchange, tenant=TenantState, reserved=double, now=double, refused=int)
    cpdef void next_request(self) except *
    cpdef void respond(self, int status, bytes body, bytes request_id=*, bytes extra=*, bytes content_type=*) except *
    cpdef void request_done(self, double now) except *
    cpdef void close(self)
    cdef void send_continue(self) except *

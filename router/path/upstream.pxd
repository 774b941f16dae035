# Types of router/path/upstream.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router.protocol cimport _wire
from router.protocol._wire cimport monotonic
from router.protocol.sink cimport AnswerSink
from router.path.sender cimport Sender


cdef class UpstreamConnection
cdef class UpstreamPool


cdef class ResponseListener:
    cpdef void upstream_headers(self, int status, _wire.ResponseReader head) except *
    cpdef void upstream_body(self, bytes data) except *
    cpdef void upstream_complete(self, bint reusable) except *
    cpdef void upstream_lost(self, str reason, bint reused) except *


cdef class UpstreamConnection(AnswerSink):
    cdef public UpstreamPool pool
    cdef public object transport
    cdef public Sender out  # the request's bytes
    cdef public _wire.ResponseReader reader
    cdef public ResponseListener listener
    cdef public bint closed
    cdef public long served
    cdef public double idle_since
    cdef public bint paused

    cpdef bint send(self, ResponseListener listener, bytes request)
    cpdef void answer_head(self, int status) except *
    cpdef void answer_body(self, bytes data) except *
    cpdef void answer_complete(self, bint keep_alive) except *
    cpdef void close(self)
    cpdef void detach(self)


cdef class UpstreamPool:
    cdef public str url
    cdef public str host
    cdef public int port
    cdef public bytes host_header
    cdef public bytes path_prefix
    cdef public double connect_timeout
    cdef public Py_ssize_t max_idle
    cdef public double max_idle_s
    cdef public list idle
    cdef public set open
    cdef public object loop

    @cython.locals(conn=UpstreamConnection)
    cpdef UpstreamConnection take_idle(self, double now)
    cpdef void put_back(self, UpstreamConnection conn)
    cpdef void forget(self, UpstreamConnection conn)

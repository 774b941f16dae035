# Types of router/path/exchange.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router.path cimport _fastpath
from router.path.sender cimport Sender

from router.protocol cimport _wire
from router.protocol._wire cimport monotonic, usage_tokens
from router.path.context cimport ProxyContext
from router.telemetry.metrics cimport ModelStats
from router.tenancy.tenants cimport TenantState
from router.path.upstream cimport ResponseListener, UpstreamConnection, UpstreamPool


cdef class Exchange


cdef class ClientSide:
    cdef public ProxyContext ctx
    cdef public object transport
    cdef public Sender out  # its transport's bytes
    cdef public bytes peer
    cdef public Exchange exchange
    cdef public bint closed
    cdef public bint keep_alive
    cdef public bint writing_paused

    cpdef void respond(self, int status, bytes body, bytes request_id=*, bytes extra=*, bytes content_type=*) except *
    cpdef void request_done(self, double now) except *
    cpdef void close(self)


cdef class Exchange(ResponseListener):
    cdef public ClientSide client
    cdef public ProxyContext ctx
    cdef public str model
    cdef public str routed_model
    cdef public str label
    cdef public ModelStats stats
    cdef public bint ask_each_replica
    cdef public _wire.Request request
    cdef public bytes request_id
    cdef public double started
    cdef public object key
    cdef public object stage
    cdef public long slot
    cdef public tuple tried
    cdef public UpstreamConnection upstream
    cdef public UpstreamPool pool
    cdef public object connecting
    cdef public bint stale_retried
    cdef public bint chunked
    cdef public bint sse
    cdef public int status
    cdef public double deadline
    cdef public bint first_chunk_seen
    cdef public str last_failure
    cdef public TenantState tenant
    cdef public double reserved
    cdef public bytes tail
    cdef public Py_ssize_t events
    cdef public double queued_at
    cdef public bint cut
    cdef public object trace
    cdef public int way  # an adapter's request: how it was served (exchange.py's WAY_*)
    cdef public int over_share

    cdef void begin(self, ClientSide client, tuple target, _wire.Request request, bytes request_id, object key, TenantState tenant=*, double reserved=*) except *
    @cython.locals(allowed=long, to=long)
    cpdef void _move(self, object stage) except *
    cpdef void start(self)
    cpdef void wait_for_share(self, int refused) except *
    cpdef void share_granted(self) except *
    cdef void _refuse_over_share(self) except *
    @cython.locals(table=_fastpath.EndpointTable, slot=long, now=double)
    cdef void _pick(self) except *
    cdef void _no_replica(self, long result) except *
    cdef void _take(self, _fastpath.EndpointTable table, long slot) except *
    cdef bint _resolve(self) except *
    @cython.locals(ctx=ProxyContext, due=bint)
    cdef object _sampled(self, _wire.Request request, bytes request_id)
    cdef void _trace_picked(self, _fastpath.EndpointTable table, long slot) except *
    @cython.locals(prompt=cython.longlong, completion=cython.longlong, used=cython.longlong)
    cdef void _trace_end(self, int status) except *
    cdef void _connect(self) except *
    cdef void _send(self, UpstreamConnection conn, bint reused, double now) except *
    cpdef bytes request_bytes(self, UpstreamPool pool)
    cdef void _lost_before_answer(self, bint reused) except *
    cdef void _replica_failed(self, str kind) except *
    cdef void _release(self, bint failed) except *
    cdef void _ejected(self, long slot) except *
    cdef void _end_broken_answer(self, str message) except *
    cpdef void _finish(self, int status, bint failed=*, tuple error=*, bytes extra=*) except *
    cdef void _broke(self, object exc)
    @cython.locals(prompt=cython.longlong, completion=cython.longlong, used=cython.longlong, waited=double)
    cdef void _settle(self, int status) except *
    @cython.locals(most=Py_ssize_t, tail=bytes)
    cdef void _keep_tail(self, bytes data) except *
    cdef void _write(self, bytes data) except *
    cpdef void upstream_headers(self, int status, _wire.ResponseReader head) except *
    @cython.locals(upstream=UpstreamConnection)
    cpdef void upstream_body(self, bytes data) except *
    cpdef void upstream_complete(self, bint reusable) except *
    cpdef void upstream_lost(self, str reason, bint reused) except *

# Types of router/path/context.py when compiled (Cython's pure Python mode): the .py is the code.

from router.path cimport _fastpath
from router.telemetry.metrics cimport RouterMetrics
from router.path.upstream cimport UpstreamPool
from router.protocol._wire cimport numbered
from router.tenancy.tenants cimport TenantBook


cdef class ProxyContext:
    cdef public _fastpath.EndpointTable table
    cdef public str router_id
    cdef public str incarnation
    cdef public double started
    cdef public object config
    cdef public RouterMetrics metrics
    cdef public object shared_metrics
    cdef public object catalog
    cdef public dict pools
    cdef public set connections
    cdef public object loop
    cdef public object clock
    cdef public Py_ssize_t last_id
    cdef public bytes _id_prefix
    cdef public frozenset routed_models
    cdef public dict parked
    cdef public dict parked_since
    cdef public dict wake_traces
    cdef public dict waiting_reason
    cdef public object on_demand
    cdef public dict affinity_by_model
    cdef public object extra_metrics
    cdef public object tracing
    cdef public long trace_countdown
    cdef public TenantBook tenants
    cdef public dict share_waiting
    cdef public bint shares_grow
    cdef public object on_share_wanted
    cdef public dict slot_waiting
    cdef public Py_ssize_t slot_waiters
    cdef public object resolvers  # router/control/resolvers.py
    cdef public frozenset adapter_models  # resolvers.adapters, read on every pick
    # settings read on every request, copied from `config`
    cdef public bint keys_required
    cdef public str affinity
    cdef public Py_ssize_t affinity_prefix_chars
    cdef public double first_byte_timeout_s
    cdef public double idle_timeout_s
    cdef public Py_ssize_t max_tries

    cpdef bytes new_request_id(self)
    cpdef UpstreamPool pool_for(self, str url)
    cpdef bint park(self, object exchange) except *
    cpdef void unpark(self, object exchange) except *

# Types of the per-request counters in router/telemetry/metrics.py when compiled (Cython's pure Python
# mode): the .py is the code.

cimport cython

cdef class Histogram:
    cdef public tuple buckets
    cdef public list counts
    cdef public double total
    cdef public long count

    @cython.locals(at=Py_ssize_t, bound=double)
    cpdef void observe(self, double value) except *


cdef class ModelStats:
    cdef public dict requests
    cdef public long long ok_requests
    cdef public dict durations
    cdef public Histogram ok_durations  # durations[2]
    cdef public Histogram first_token

    @cython.locals(histogram=Histogram)
    cpdef void finished(self, int status, object seconds) except *
    cpdef dict request_counts(self)


cdef class RouterMetrics:
    cdef public dict models
    cdef public dict upstream_errors
    cdef public dict ejections
    cdef public dict parked
    cdef public dict wakes
    cdef public long retries
    cdef public long in_flight

    cpdef ModelStats model(self, str label)
    cpdef void upstream_error(self, str model, str kind) except *

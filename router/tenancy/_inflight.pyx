# cython: boundscheck=False, wraparound=False
"""Requests in flight counted across a router's workers (`gpurouter --workers N`), so that a
tenants file's `max_in_flight` holds for the process as a whole, exactly.

One anonymous shared mapping, made before the workers are forked, holds a cell per tenant: the
tenant's key (64 bits of its name's BLAKE2b, claimed by compare-and-swap), the workers' total
in flight, and each worker's own part. A request is admitted by a compare-and-swap of the total
while it is under the limit, so no two workers can both take the last place; a worker's part is
what its parent gives back (`reclaim`) if the worker dies with requests counted. C atomics; the
twin, router/tenancy/inflight_py.py, does the same under a lock.
"""

import mmap

from libc.stdint cimport int64_t, uint64_t

from router.tenancy.inflight_py import CAPACITY, name_key

cdef extern from *:
    """
    #include <stdint.h>
    static inline int64_t gf_load(int64_t *p) {
        return __atomic_load_n(p, __ATOMIC_ACQUIRE);
    }
    static inline int gf_cas(int64_t *p, int64_t expected, int64_t desired) {
        return __atomic_compare_exchange_n(
            p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    static inline int64_t gf_add(int64_t *p, int64_t v) {
        return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL);
    }
    static inline int64_t gf_exchange(int64_t *p, int64_t v) {
        return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL);
    }
    """
    int64_t gf_load(int64_t *p) nogil
    bint gf_cas(int64_t *p, int64_t expected, int64_t desired) nogil
    int64_t gf_add(int64_t *p, int64_t v) nogil
    int64_t gf_exchange(int64_t *p, int64_t v) nogil

cdef class SharedInFlight:
    cdef object _map
    cdef unsigned char[::1] _view
    cdef int64_t* _cells
    cdef readonly int workers
    cdef readonly int capacity
    cdef Py_ssize_t _stride
    cdef public int worker  # this process's number, set in each worker after the fork

    def __init__(self, int workers, int capacity=CAPACITY):
        if workers < 1 or capacity < 1:
            raise ValueError("at least one worker and one cell")
        self.workers = workers
        self.capacity = capacity
        self._stride = 2 + workers  # key, total, one part per worker
        self._map = mmap.mmap(-1, capacity * self._stride * 8)  # MAP_SHARED: forks see it
        self._view = self._map
        self._cells = <int64_t*>&self._view[0]
        self.worker = 0

    cpdef long cell(self, str name) except -2:
        """The cell counting tenant `name`, claimed if new; -1 when every cell is taken."""
        cdef int64_t key = name_key(name)
        cdef uint64_t first = <uint64_t>key % <uint64_t>self.capacity
        cdef long cell
        cdef int64_t* at
        cdef int i
        for i in range(self.capacity):
            cell = (first + i) % self.capacity
            at = self._cells + cell * self._stride
            if gf_load(at) == key:
                return cell
            if gf_load(at) == 0 and (gf_cas(at, 0, key) or gf_load(at) == key):
                return cell
        return -1

    cpdef bint acquire(self, long cell, long limit) except -1:
        """Count one more request in flight on `cell` unless `limit` are already."""
        cdef int64_t* at = self._cells + cell * self._stride
        cdef int64_t now
        while True:
            now = gf_load(at + 1)
            if now >= limit:
                return False
            if gf_cas(at + 1, now, now + 1):
                gf_add(at + 2 + self.worker, 1)
                return True

    cpdef void release(self, long cell) noexcept:
        cdef int64_t* at = self._cells + cell * self._stride
        gf_add(at + 1, -1)
        gf_add(at + 2 + self.worker, -1)

    cpdef long total(self, long cell) noexcept:
        return gf_load(self._cells + cell * self._stride + 1)

    def reclaim(self, int worker):
        """Worker `worker` ended: what it still counted is no longer in flight. Returns how
        many requests that was."""
        cdef int i
        cdef int64_t held, freed = 0
        cdef int64_t* at
        if not 0 <= worker < self.workers:
            raise ValueError(f"no worker {worker}")
        for i in range(self.capacity):
            at = self._cells + i * self._stride
            held = gf_exchange(at + 2 + worker, 0)
            if held:
                gf_add(at + 1, -held)
                freed += held
        return freed

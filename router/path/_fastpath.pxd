# The endpoint table's C layout, so that compiled router modules call its per-request methods
# (acquire, release, endpoint_url) as C functions.

cimport cython
from libc.stdint cimport int32_t, int64_t, uint64_t


cdef struct Slot:
    int32_t model            # index of its model, SLOT_RETIRED once removed
    int32_t in_flight
    int64_t last_used_ns     # NEVER until the first use since it was watched
    int64_t watched_since_ns
    int32_t consecutive_failures
    int32_t ejections        # how many times in a row it has been ejected
    int64_t ejected_until_ns # 0 when not ejected
    int64_t last_ejection_end_ns
    uint64_t id_hash         # where the endpoint sits for keyed picks (endpoint_hash of its id)
    int64_t picked           # requests sent to it since it was watched: the control plane's
                             # measure of each model's popularity (its request rate)
    # The engine's own load, as the load reader last read it (router/load/engineload.py):
    int32_t engine_load      # its waiting + running, less this router's requests on it then
    int32_t kv_full          # its KV-cache use above the table's threshold
    int32_t queueing         # requests waited in its queue: a new one would wait too
    int64_t load_until_ns    # the reading is used until then; 0: no reading


cdef struct Model:
    int32_t first            # offset into the model-slot index
    int32_t count
    int32_t cursor           # rotates ties
    int32_t ejected


@cython.final
cdef class EndpointTable:
    cdef int _lock
    cdef Slot* _slots
    cdef int32_t _slot_capacity
    cdef int32_t _slot_count
    cdef Model* _models
    cdef int32_t* _model_slots
    cdef dict _model_index
    cdef list _ids
    cdef list _gone_ids      # the id a retired slot had, while requests may still be on it
    cdef list _urls
    cdef list _model_names
    cdef object _update_lock
    cdef readonly int64_t version
    cdef int64_t _pinned_ns
    cdef readonly int32_t failures_to_eject
    cdef readonly int64_t base_ejection_ns
    cdef readonly int64_t max_ejection_ns
    cdef readonly int32_t max_ejection_percent
    cdef readonly int32_t max_in_flight
    cdef readonly double load_factor
    cdef readonly int64_t last_snapshot_lock_ns
    cdef readonly int64_t ejections_total
    cdef readonly double kv_threshold
    cdef bint _readings      # any engine reading was ever given: picks need the clock

    cpdef int acquire(self, str model, uint64_t key=*, tuple exclude=*) except? -9
    cpdef bint release(self, int slot, bint failed=*) noexcept
    cpdef str endpoint_url(self, int slot)
    cdef void _lock_acquire(self) noexcept
    cdef bint _model_is_recent(self, int32_t m, int64_t since) noexcept
    cdef int64_t _now(self) noexcept nogil
    cdef int32_t _keyed_pick(self, Model* mdl, uint64_t key, int32_t* excluded,
                             int32_t n_excluded, int32_t usable, int32_t model_load,
                             int32_t least, int64_t now) noexcept
    cdef bint _try_eject(self, Slot* s, int64_t now) noexcept
    cdef _apply(self, dict wanted, object version)

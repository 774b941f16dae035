# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""EndpointTable: per-endpoint load, last use and passive ejection under one C-level lock.

The per-request calls (`acquire`, `release`) touch only C arrays: no Python object is
created and nothing is allocated. `update` and `snapshot` do their Python work outside the
lock and hold it only for pointer swaps or a raw copy.
"""

import threading

cimport cython

from router.path.fastpath_py import endpoint_hash, normalise_routes

from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef extern from "time.h" nogil:
    enum: CLOCK_MONOTONIC_COARSE


cdef extern from *:
    """
    #include <sched.h>
    /* A test-and-set lock: uncontended it is one atomic exchange, half the cost of a mutex,
       and the sections it guards are a few dozen instructions long. */
    static inline int table_lock_try(int *flag) {
        return __atomic_exchange_n(flag, 1, __ATOMIC_ACQUIRE) == 0;
    }
    static inline void table_lock_wait(int *flag) {
        while (__atomic_load_n(flag, __ATOMIC_RELAXED) || !table_lock_try(flag)) sched_yield();
    }
    static inline void table_lock_release(int *flag) {
        __atomic_store_n(flag, 0, __ATOMIC_RELEASE);
    }
    """
    bint table_lock_try(int* flag) nogil
    void table_lock_wait(int* flag) nogil
    void table_lock_release(int* flag) nogil


cdef enum:
    NEVER = -1
    SLOT_RETIRED = -1
    MAX_EXCLUDED_ = 16  # excluded slots copied on the stack; more spill to the heap

cdef enum AcquireResult:
    NO_MODEL_ = -1
    NO_ENDPOINT_ = -2
    SATURATED_ = -3


cdef inline int64_t monotonic_ns() noexcept nogil:
    # The coarse clock (one kernel tick, a few ms) costs a third of the precise one here and
    # idle times and ejections are counted in seconds.
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline uint64_t key_score(uint64_t key, uint64_t id_hash) noexcept nogil:
    # splitmix64's finaliser: the same score as fastpath_py.key_score.
    cdef uint64_t z = key ^ id_hash
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline bint within_bound(int32_t in_flight, int32_t usable, double load_factor,
                              int32_t model_load) noexcept nogil:
    # in_flight + 1 <= ceil(load_factor * (model_load + 1) / usable), without a division:
    # the same test as fastpath_py.within_bound.
    return in_flight * usable < load_factor * (model_load + 1)


cdef inline int32_t slot_load(Slot* s, int64_t now) noexcept nogil:
    # This router's own requests in flight, plus, at a fresh reading, the engine's other
    # requests (its waiting + running then, less this router's in flight then).
    if s.load_until_ns > now:
        return s.engine_load + s.in_flight
    return s.in_flight


cdef inline bint kv_full(Slot* s, int64_t now) noexcept nogil:
    return s.kv_full and s.load_until_ns > now


cdef inline bint cannot_start(Slot* s, int64_t now) noexcept nogil:
    # At a fresh reading, a request sent there would wait: its KV cache is full, or requests
    # wait in its queue. A key's replica is then worth no more than any other (its cache
    # saves a prefill only once the request runs): the same test as fastpath_py.cannot_start.
    return (s.kv_full or s.queueing) and s.load_until_ns > now


cdef inline bint is_excluded(int32_t slot, int32_t* excluded, int32_t n_excluded) noexcept nogil:
    cdef int32_t i
    for i in range(n_excluded):
        if excluded[i] == slot:
            return True
    return False


cdef inline int64_t precise_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


### Public API ###

NO_MODEL = NO_MODEL_
NO_ENDPOINT = NO_ENDPOINT_
SATURATED = SATURATED_


@cython.final
cdef class EndpointTable:
    """Routing table of model -> endpoints, with least-loaded selection and outlier ejection."""

    def __cinit__(self):
        self._lock = 0

    def __init__(
        self,
        int failures_to_eject=5,
        double base_ejection_s=30.0,
        double max_ejection_s=300.0,
        int max_ejection_percent=50,
        int max_in_flight=0,
        double load_factor=1.25,
        double kv_threshold=0.8,
    ):
        if failures_to_eject < 1:
            raise ValueError("failures_to_eject must be at least 1")
        if not 0 <= max_ejection_percent <= 100:
            raise ValueError("max_ejection_percent must be within 0..100")
        if not load_factor >= 1.0:
            raise ValueError("load_factor must be at least 1")
        if not 0.0 < kv_threshold <= 1.0:
            raise ValueError("kv_threshold must be within (0, 1]")
        self.load_factor = load_factor
        self.kv_threshold = kv_threshold
        self._readings = False
        self.failures_to_eject = failures_to_eject
        self.base_ejection_ns = <int64_t>(base_ejection_s * 1e9)
        self.max_ejection_ns = <int64_t>(max_ejection_s * 1e9)
        self.max_ejection_percent = max_ejection_percent
        self.max_in_flight = max_in_flight
        self._model_index = {}
        self._ids = []
        self._gone_ids = []
        self._urls = []
        self._model_names = []
        self._update_lock = threading.Lock()
        self._pinned_ns = NEVER
        self.version = -1

    def __dealloc__(self):
        free(self._slots)
        free(self._models)
        free(self._model_slots)

    cdef void _lock_acquire(self) noexcept:
        # Wait without the GIL, so that a holder that needs it can always finish.
        if not table_lock_try(&self._lock):
            with nogil:
                table_lock_wait(&self._lock)

    cdef int64_t _now(self) noexcept nogil:
        if self._pinned_ns != NEVER:
            return self._pinned_ns
        return monotonic_ns()

    def _pin_clock(self, seconds):
        """Test hook: freeze the table's clock at `seconds`, or release it with None."""
        self._pinned_ns = NEVER if seconds is None else <int64_t>(seconds * 1e9)

    cpdef int acquire(self, str model, uint64_t key=0, tuple exclude=()) except? -9:
        """Pick an endpoint of `model` and count a request on it (it reports as used now
        until the matching release stamps the end of the use).

        Endpoints that are ejected or whose slot is in `exclude` (the slots this request
        already tried) are skipped. An endpoint's load is this router's requests in flight on
        it, plus, at a fresh reading (`set_load`), the engine's other requests. With key 0: the
        least loaded, ties rotate. With a key: rendezvous
        hashing with bounded loads, the highest-scoring endpoint for the key whose
        load stays within ceil(load_factor * (model load + 1) / usable) and whose KV cache is
        not full.

        Returns the slot, or NO_MODEL (unknown model), NO_ENDPOINT (no usable endpoint),
        SATURATED (every usable endpoint is at max_in_flight).
        """
        cdef int32_t m, i, pos, slot, load, best = -1, best_pos = 0, best_load = 0
        cdef int32_t usable = 0, model_load = 0, n_excluded = 0, top = -1
        cdef uint64_t score, top_score = 0
        cdef int32_t on_stack[MAX_EXCLUDED_]
        cdef int32_t* excluded = on_stack
        cdef bytearray spilled  # more than fit on the stack: freed with this call's locals
        cdef Model* mdl
        cdef Slot* s
        if exclude:
            n_excluded = len(exclude)
            if n_excluded > MAX_EXCLUDED_:
                # An adapter held on many replicas excludes them all from its resolver route.
                spilled = bytearray(n_excluded * sizeof(int32_t))
                excluded = <int32_t*><char*>spilled
            for i in range(n_excluded):
                excluded[i] = exclude[i]
        self._lock_acquire()
        # Looked up under the lock: an update swaps the index and the model array together.
        cdef object found = self._model_index.get(model)
        if found is None:
            table_lock_release(&self._lock)
            return NO_MODEL_
        m = found
        mdl = &self._models[m]
        # The clock is needed only to lift expired ejections and to tell fresh readings. The
        # last use is stamped by release: while a request is in flight the endpoint counts as
        # in use now anyway.
        cdef int64_t now = self._now() if mdl.ejected > 0 or self._readings else 0
        pos = mdl.cursor
        for i in range(mdl.count):
            if pos == mdl.count:
                pos = 0
            slot = self._model_slots[mdl.first + pos]
            s = &self._slots[slot]
            if s.ejected_until_ns != 0:
                if s.ejected_until_ns > now:
                    pos += 1
                    continue
                s.ejected_until_ns = 0
                s.last_ejection_end_ns = now
                mdl.ejected -= 1
            if n_excluded and is_excluded(slot, excluded, n_excluded):
                pos += 1
                continue
            usable += 1
            load = slot_load(s, now)
            model_load += load
            # The cap is on this router's own requests, whatever the engines say: a full
            # endpoint is passed over for one with room, never waited for while one has it.
            if self.max_in_flight > 0 and s.in_flight >= self.max_in_flight:
                pos += 1
                continue
            if best == -1 or load < best_load:
                best = slot
                best_pos = pos
                best_load = load
            if key != 0:
                score = key_score(key, s.id_hash)
                if top == -1 or score > top_score:
                    top = slot
                    top_score = score
            pos += 1
        if best == -1:
            table_lock_release(&self._lock)
            return SATURATED_ if usable else NO_ENDPOINT_
        if key != 0:
            # Most often the key's own endpoint is within the bound: no second pass then.
            s = &self._slots[top]
            if within_bound(
                slot_load(s, now), usable, self.load_factor, model_load
            ) and not cannot_start(s, now):
                best = top
            else:
                best = self._keyed_pick(
                    mdl, key, excluded, n_excluded, usable, model_load, best, now
                )
        s = &self._slots[best]
        s.in_flight += 1
        s.picked += 1
        if key == 0:
            mdl.cursor = best_pos + 1 if best_pos + 1 < mdl.count else 0
        table_lock_release(&self._lock)
        return best

    cdef int32_t _keyed_pick(self, Model* mdl, uint64_t key, int32_t* excluded,
                             int32_t n_excluded, int32_t usable, int32_t model_load,
                             int32_t least, int64_t now) noexcept:
        # Rendezvous hashing with bounded loads; `least` when no endpoint is within the bound.
        cdef int32_t i, slot, best = -1
        cdef uint64_t score, best_score = 0
        cdef Slot* s
        for i in range(mdl.count):
            slot = self._model_slots[mdl.first + i]
            s = &self._slots[slot]
            if s.ejected_until_ns != 0 or cannot_start(s, now) or not within_bound(
                slot_load(s, now), usable, self.load_factor, model_load
            ):
                continue
            if self.max_in_flight > 0 and s.in_flight >= self.max_in_flight:
                continue
            if n_excluded and is_excluded(slot, excluded, n_excluded):
                continue
            score = key_score(key, s.id_hash)
            if best == -1 or score > best_score:
                best = slot
                best_score = score
        return least if best == -1 else best

    cpdef bint release(self, int slot, bint failed=False) noexcept:
        """End a request on `slot`; count a failure towards ejection when `failed`.
        Returns whether this failure ejected the endpoint."""
        cdef bint ejected = False
        if slot < 0:
            return False
        self._lock_acquire()
        if slot >= self._slot_count:
            table_lock_release(&self._lock)
            return False
        cdef int64_t now = self._now()
        cdef Slot* s = &self._slots[slot]
        if s.in_flight > 0:
            s.in_flight -= 1
        s.last_used_ns = now
        if s.model != SLOT_RETIRED:
            if failed:
                s.consecutive_failures += 1
                if s.consecutive_failures >= self.failures_to_eject and s.ejected_until_ns == 0:
                    ejected = self._try_eject(s, now)
            else:
                s.consecutive_failures = 0
        table_lock_release(&self._lock)
        return ejected

    cdef bint _try_eject(self, Slot* s, int64_t now) noexcept:
        cdef Model* mdl = &self._models[s.model]
        cdef int32_t allowed = mdl.count * self.max_ejection_percent // 100
        if allowed < 1:
            allowed = 1
        if allowed > mdl.count - 1:
            allowed = mdl.count - 1
        if mdl.ejected >= allowed:
            return False
        if s.last_ejection_end_ns != 0 and now - s.last_ejection_end_ns > self.max_ejection_ns:
            s.ejections = 0
        s.ejections += 1
        cdef int64_t duration = self.base_ejection_ns * s.ejections
        if duration > self.max_ejection_ns:
            duration = self.max_ejection_ns
        s.ejected_until_ns = now + duration
        s.consecutive_failures = 0
        mdl.ejected += 1
        self.ejections_total += 1
        return True

    def update(self, routes, version=None):
        """Replace the table with `routes` ({model: [(endpoint_id, url), ...]}) atomically.

        Endpoints are matched by (model, id): survivors keep slot, counts and stamps; new ones
        start never used and watched from now; removed ones are retired, and a retired slot is
        reused only once nothing is in flight on it.
        """
        wanted = normalise_routes(routes)
        self._update_lock.acquire()
        try:
            self._apply(wanted, version)
        finally:
            self._update_lock.release()

    cdef _apply(self, dict wanted, object version):
        # Only update changes which model and id a slot holds, and updates are serialised, so
        # the plan can be made without the table lock. Counts and stamps keep moving meanwhile;
        # they are carried over under the lock.
        cdef int32_t slot, m, k, n_models = len(wanted), n_slots = self._slot_count
        current = {}
        for slot in range(n_slots):
            if self._slots[slot].model != SLOT_RETIRED:
                current[(self._model_names[self._slots[slot].model], self._ids[slot])] = slot
        reusable = [slot for slot in range(n_slots - 1, -1, -1)
                    if self._slots[slot].model == SLOT_RETIRED and self._slots[slot].in_flight == 0]
        names = list(wanted)
        ids = list(self._ids)
        urls = list(self._urls)
        gone_ids = list(self._gone_ids)
        plan = []      # (model index, slot, is new, id hash)
        for m, name in enumerate(names):
            for endpoint_id, url in wanted[name]:
                slot = current.pop((name, endpoint_id), -1)
                is_new = slot == -1
                if is_new:
                    if reusable:
                        slot = reusable.pop()
                    else:
                        slot = len(ids)
                        ids.append(None)
                        urls.append(None)
                        gone_ids.append(None)
                    gone_ids[slot] = None
                ids[slot] = endpoint_id
                urls[slot] = url
                plan.append((m, slot, is_new, endpoint_hash(endpoint_id)))
        retired = list(current.values())
        for slot in retired:
            gone_ids[slot] = ids[slot]
            ids[slot] = None
            urls[slot] = None
        cdef int32_t total_slots = len(ids)
        cdef Model* models = <Model*>calloc(max(1, n_models), sizeof(Model))
        cdef int32_t* model_slots = <int32_t*>malloc(max(1, len(plan)) * sizeof(int32_t))
        cdef Slot* grown = NULL
        if total_slots > self._slot_capacity:
            grown = <Slot*>calloc(max(16, total_slots, 2 * self._slot_capacity), sizeof(Slot))
        if models == NULL or model_slots == NULL or (total_slots > self._slot_capacity and grown == NULL):
            free(models)
            free(model_slots)
            free(grown)
            raise MemoryError()
        k = 0
        for m, name in enumerate(names):
            models[m].first = k
            k += len(wanted[name])
        new_index = {name: m for m, name in enumerate(names)}
        cdef Slot* s
        cdef bint fresh
        cdef int64_t now
        cdef uint64_t id_hash
        self._lock_acquire()
        now = self._now()
        if grown != NULL:
            memcpy(grown, self._slots, n_slots * sizeof(Slot))
            free(self._slots)
            self._slots = grown
            self._slot_capacity = max(16, total_slots, 2 * self._slot_capacity)
        for slot in retired:
            s = &self._slots[slot]
            s.model = SLOT_RETIRED
            s.ejected_until_ns = 0
        for m, slot, fresh, id_hash in plan:
            s = &self._slots[slot]
            s.id_hash = id_hash
            if fresh:
                s.in_flight = 0
                s.picked = 0
                s.load_until_ns = 0
                s.last_used_ns = NEVER
                s.watched_since_ns = now
                s.consecutive_failures = 0
                s.ejections = 0
                s.ejected_until_ns = 0
                s.last_ejection_end_ns = 0
            s.model = m
            model_slots[models[m].first + models[m].count] = slot
            models[m].count += 1
            if s.ejected_until_ns != 0:
                models[m].ejected += 1
        self._slot_count = total_slots
        models, self._models = self._models, models
        model_slots, self._model_slots = self._model_slots, model_slots
        old = (self._ids, self._urls, self._gone_ids, self._model_names, self._model_index)
        self._ids = ids
        self._gone_ids = gone_ids
        self._urls = urls
        self._model_names = names
        self._model_index = new_index
        self.version = self.version + 1 if version is None else version
        table_lock_release(&self._lock)
        free(models)
        free(model_slots)
        del old

    def snapshot(self):
        """Activity map: {"used": {id: s since last use}, "watched": {id: s watched},
        "in_flight": {id: requests}, "requests": {id: requests sent since watched}};
        `in_flight` counts removed endpoints' requests too.

        The lock is held only to copy the raw slot array; the dicts are built after.
        """
        cdef int32_t n, capacity = 0, slot
        cdef Slot* copy = NULL
        cdef int64_t now, t0
        while True:
            # Allocate outside the lock; retry in the rare case the table grew meanwhile.
            self._lock_acquire()
            if self._slot_count <= capacity:
                break
            capacity = self._slot_count
            table_lock_release(&self._lock)
            free(copy)
            copy = <Slot*>malloc(capacity * sizeof(Slot))
            if copy == NULL:
                raise MemoryError()
            # Touch the pages now: faulting them in during the copy would be under the lock.
            memset(copy, 0, capacity * sizeof(Slot))
        t0 = precise_ns()
        n = self._slot_count
        ids = self._ids
        gone_ids = self._gone_ids
        now = self._now()
        if n:
            memcpy(copy, self._slots, n * sizeof(Slot))
        self.last_snapshot_lock_ns = precise_ns() - t0
        table_lock_release(&self._lock)
        used = {}
        watched = {}
        in_flight = {}
        picked = {}
        try:
            for slot in range(n):
                if copy[slot].model == SLOT_RETIRED:
                    # Removed, but requests still on it: in use, and not to be stopped yet.
                    endpoint_id = gone_ids[slot]
                    if copy[slot].in_flight > 0 and endpoint_id is not None:
                        in_flight[endpoint_id] = in_flight.get(endpoint_id, 0) + copy[slot].in_flight
                        used[endpoint_id] = 0.0
                    continue
                endpoint_id = ids[slot]
                # One id may stand in two routes (a replica and its base's resolver route): the
                # longest watched and the latest use speak for it.
                seen = max(0.0, (now - copy[slot].watched_since_ns) / 1e9)
                watched[endpoint_id] = max(watched.get(endpoint_id, 0.0), seen)
                picked[endpoint_id] = picked.get(endpoint_id, 0) + copy[slot].picked
                if copy[slot].in_flight > 0:
                    used[endpoint_id] = 0.0
                    in_flight[endpoint_id] = in_flight.get(endpoint_id, 0) + copy[slot].in_flight
                elif copy[slot].last_used_ns != NEVER:
                    idle = max(0.0, (now - copy[slot].last_used_ns) / 1e9)
                    used[endpoint_id] = min(used.get(endpoint_id, idle), idle)
        finally:
            free(copy)
        return {"used": used, "watched": watched, "in_flight": in_flight, "requests": picked}

    def load_targets(self, double recent_s):
        """[(slot, endpoint id, url, in flight)] of every endpoint of each model this router
        sent a request to within `recent_s` (or has one in flight to): what the load reader
        reads."""
        cdef int32_t m, i, slot, n = 0, n_models
        cdef int32_t* slots = NULL
        cdef int64_t* marks = NULL
        cdef int64_t now, since
        self._lock_acquire()
        # Allocated under the lock, once a round: the table cannot change size meanwhile.
        slots = <int32_t*>malloc(max(1, self._slot_count) * sizeof(int32_t))
        marks = <int64_t*>malloc(max(1, self._slot_count) * sizeof(int64_t))
        if slots == NULL or marks == NULL:
            table_lock_release(&self._lock)
            free(slots)
            free(marks)
            raise MemoryError()
        now = self._now()
        since = now - <int64_t>(recent_s * 1e9)
        n_models = len(self._model_names)
        for m in range(n_models):
            if not self._model_is_recent(m, since):
                continue
            for i in range(self._models[m].count):
                slot = self._model_slots[self._models[m].first + i]
                slots[n] = slot
                marks[n] = self._slots[slot].in_flight
                n += 1
        ids, urls = self._ids, self._urls
        table_lock_release(&self._lock)
        try:
            return [(slots[i], ids[slots[i]], urls[slots[i]], marks[i]) for i in range(n)]
        finally:
            free(slots)
            free(marks)

    def recent_models(self, double recent_s):
        """The models `load_targets` would take the endpoints of, in table order: the load
        reader builds its targets again only when these (or the route version) change."""
        cdef int32_t m
        cdef int64_t since
        names = []
        self._lock_acquire()
        since = self._now() - <int64_t>(recent_s * 1e9)
        for m in range(len(self._model_names)):
            if self._model_is_recent(m, since):
                names.append(self._model_names[m])
        table_lock_release(&self._lock)
        return names

    cdef bint _model_is_recent(self, int32_t m, int64_t since) noexcept:
        """Whether a request went to one of model `m`'s endpoints since `since` (ns), or is
        in flight on one. Under the lock."""
        cdef int32_t i
        cdef Slot* s
        for i in range(self._models[m].count):
            s = &self._slots[self._model_slots[self._models[m].first + i]]
            if s.in_flight > 0 or (s.last_used_ns != NEVER and s.last_used_ns >= since):
                return True
        return False

    def set_load(self, int slot, str endpoint_id, int waiting, int running, double kv_use,
                 int64_t mark, double valid_s):
        """Take an engine's reading for `slot` (if it still holds `endpoint_id`), asked for
        while this router had `mark` requests in flight on it: its other requests, waiting +
        running - mark, count in picks for `valid_s`. Returns whether it was taken."""
        cdef bint taken = False
        cdef int64_t load = <int64_t>max(0, waiting) + max(0, running)
        cdef Slot* s
        self._lock_acquire()
        if 0 <= slot < self._slot_count and self._slots[slot].model != SLOT_RETIRED:
            if self._ids[slot] == endpoint_id:
                s = &self._slots[slot]
                s.engine_load = <int32_t>max(0, min(load - mark, 1 << 30))
                s.kv_full = kv_use > self.kv_threshold
                s.queueing = waiting > 0
                s.load_until_ns = self._now() + <int64_t>(valid_s * 1e9)
                self._readings = True
                taken = True
        table_lock_release(&self._lock)
        return taken

    def load_of(self, int slot):
        """(load as picks see it now, whether from a fresh reading, whether KV-full)."""
        cdef int32_t load = 0
        cdef bint fresh = False, full = False
        cdef int64_t now
        self._lock_acquire()
        if 0 <= slot < self._slot_count:
            now = self._now()
            load = slot_load(&self._slots[slot], now)
            fresh = self._slots[slot].load_until_ns > now
            full = kv_full(&self._slots[slot], now)
        table_lock_release(&self._lock)
        return load, fresh, full

    def endpoint_id(self, int slot):
        """Id of the endpoint in `slot` (None once it has been removed)."""
        if not 0 <= slot < len(self._ids):
            raise IndexError(f"no slot {slot}")
        return self._ids[slot]

    cpdef str endpoint_url(self, int slot):
        """URL of the endpoint in `slot` (None once it has been removed)."""
        if not 0 <= slot < len(self._urls):
            raise IndexError(f"no slot {slot}")
        return self._urls[slot]

    def in_flight(self, int slot):
        """Requests now in flight on `slot`."""
        cdef int32_t count = 0
        self._lock_acquire()
        if 0 <= slot < self._slot_count:
            count = self._slots[slot].in_flight
        table_lock_release(&self._lock)
        return count

    def is_ejected(self, int slot):
        """Whether `slot` is ejected now (an ejection whose time has passed does not count)."""
        cdef int64_t until = 0
        self._lock_acquire()
        if 0 <= slot < self._slot_count:
            until = self._slots[slot].ejected_until_ns
        cdef bint ejected = until != 0 and until > self._now()
        table_lock_release(&self._lock)
        return ejected

    def models(self):
        """Model names in the table, in the order they were given."""
        return list(self._model_names)

    def endpoints(self, str model):
        """[(slot, endpoint_id, url)] of `model`, or [] for an unknown model."""
        cdef int32_t i
        cdef Model mdl
        slots = []
        self._lock_acquire()
        found = self._model_index.get(model)
        if found is not None:
            mdl = self._models[<int32_t>found]
            for i in range(mdl.count):
                slots.append(self._model_slots[mdl.first + i])
        ids, urls = self._ids, self._urls
        table_lock_release(&self._lock)
        return [(slot, ids[slot], urls[slot]) for slot in slots]

    def noop(self, argument=None, key=0):
        """Does nothing: the floor of a call into this extension, for the benchmarks."""
        return 0

"""Pure-Python twin of `router.path._fastpath.EndpointTable`, with the same API and semantics.

It is the reference the differential tests compare the extension against, the baseline of the
benchmarks, and what runs when `GPUROUTER_NO_EXTENSIONS=1` or the extension is not built.
"""

from __future__ import annotations

import threading
import time

NO_MODEL = -1
NO_ENDPOINT = -2
SATURATED = -3

_NEVER = -1
_RETIRED = -1
_MASK64 = (1 << 64) - 1


def endpoint_hash(endpoint_id: str) -> int:
    """FNV-1a (64 bits) of the id's UTF-8 bytes: where an endpoint sits for keyed picks."""
    value = 0xCBF29CE484222325
    for byte in endpoint_id.encode():
        value = ((value ^ byte) * 0x100000001B3) & _MASK64
    return value


def within_bound(in_flight: int, usable: int, load_factor: float, model_load: int) -> bool:
    """in_flight + 1 <= ceil(load_factor * (model_load + 1) / usable), without a division."""
    return in_flight * usable < load_factor * (model_load + 1)


def key_score(key: int, id_hash: int) -> int:
    """Rendezvous score of an endpoint for a key (splitmix64's finaliser of key ^ id hash)."""
    z = (key ^ id_hash) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class _Slot:
    __slots__ = (
        "model",
        "in_flight",
        "last_used_ns",
        "watched_since_ns",
        "consecutive_failures",
        "ejections",
        "ejected_until_ns",
        "last_ejection_end_ns",
        "id_hash",
        "engine_load",
        "kv_full",
        "queueing",
        "load_until_ns",
        "picked",
    )

    def __init__(self, model: int, now: int) -> None:
        self.model = model
        self.id_hash = 0
        self.engine_load = 0
        self.kv_full = False
        self.queueing = False
        self.load_until_ns = 0
        self.in_flight = 0
        self.picked = 0  # requests sent to it since it was watched
        self.last_used_ns = _NEVER
        self.watched_since_ns = now
        self.consecutive_failures = 0
        self.ejections = 0
        self.ejected_until_ns = 0
        self.last_ejection_end_ns = 0


def _load(s: _Slot, now: int) -> int:
    """This router's own requests in flight, plus, at a fresh reading, the engine's other
    requests (its waiting + running then, less this router's in flight then)."""
    if s.load_until_ns > now:
        return s.engine_load + s.in_flight
    return s.in_flight


def _kv_full(s: _Slot, now: int) -> bool:
    return s.kv_full and s.load_until_ns > now


def cannot_start(s: _Slot, now: int) -> bool:
    """At a fresh reading, a request sent there would wait: its KV cache is full, or requests
    wait in its queue. A key's replica is then worth no more than any other."""
    return (s.kv_full or s.queueing) and s.load_until_ns > now


class _Model:
    __slots__ = ("slots", "cursor", "ejected")

    def __init__(self) -> None:
        self.slots: list[int] = []
        self.cursor = 0
        self.ejected = 0


class EndpointTable:
    """Routing table of model -> endpoints, with least-loaded selection and outlier ejection."""

    def __init__(
        self,
        failures_to_eject: int = 5,
        base_ejection_s: float = 30.0,
        max_ejection_s: float = 300.0,
        max_ejection_percent: int = 50,
        max_in_flight: int = 0,
        load_factor: float = 1.25,
        kv_threshold: float = 0.8,
    ) -> None:
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
        self.base_ejection_ns = int(base_ejection_s * 1e9)
        self.max_ejection_ns = int(max_ejection_s * 1e9)
        self.max_ejection_percent = max_ejection_percent
        self.max_in_flight = max_in_flight
        self.version = -1
        self.last_snapshot_lock_ns = 0
        self.ejections_total = 0
        self._lock = threading.Lock()
        self._update_lock = threading.Lock()
        self._slots: list[_Slot] = []
        self._ids: list[str | None] = []
        self._gone_ids: list[str | None] = []  # the id a retired slot had
        self._urls: list[str | None] = []
        self._models: list[_Model] = []
        self._model_names: list[str] = []
        self._model_index: dict[str, int] = {}
        self._pinned_ns = _NEVER

    def _now(self) -> int:
        return self._pinned_ns if self._pinned_ns != _NEVER else time.monotonic_ns()

    def _pin_clock(self, seconds: float | None) -> None:
        """Test hook: freeze the table's clock at `seconds`, or release it with None."""
        self._pinned_ns = _NEVER if seconds is None else int(seconds * 1e9)

    def acquire(self, model: str, key: int = 0, exclude: tuple = ()) -> int:
        with self._lock:
            m = self._model_index.get(model)
            if m is None:
                return NO_MODEL
            mdl = self._models[m]
            # Only expired ejections and fresh readings need the clock; release stamps the
            # last use.
            now = self._now() if mdl.ejected > 0 or self._readings else 0
            count = len(mdl.slots)
            best = -1
            best_pos = 0
            best_load = 0
            usable = 0
            model_load = 0
            for i in range(count):
                pos = (mdl.cursor + i) % count
                slot = mdl.slots[pos]
                s = self._slots[slot]
                if s.ejected_until_ns != 0:
                    if s.ejected_until_ns > now:
                        continue
                    s.ejected_until_ns = 0
                    s.last_ejection_end_ns = now
                    mdl.ejected -= 1
                if slot in exclude:
                    continue
                usable += 1
                load = _load(s, now)
                model_load += load
                # The cap is on this router's own requests, whatever the engines say: a full
                # endpoint is passed over for one with room, never waited for while one has it.
                if self.max_in_flight > 0 and s.in_flight >= self.max_in_flight:
                    continue
                if best == -1 or load < best_load:
                    best, best_pos, best_load = slot, pos, load
            if best == -1:
                return SATURATED if usable else NO_ENDPOINT
            if key:
                best = self._keyed_pick(mdl, key, exclude, usable, model_load, best, now)
            s = self._slots[best]
            s.in_flight += 1
            s.picked += 1
            if not key:
                mdl.cursor = (best_pos + 1) % count
            return best

    def _keyed_pick(self, mdl, key, exclude, usable, model_load, least, now):
        """Rendezvous hashing with bounded loads: the usable endpoint with the highest score
        for `key` among those whose load stays within the bound once this request is added
        and whose KV cache is not full; `least` when there is none."""
        best, best_score = -1, -1
        for slot in mdl.slots:
            s = self._slots[slot]
            if (
                s.ejected_until_ns != 0
                or slot in exclude
                or cannot_start(s, now)
                or not within_bound(_load(s, now), usable, self.load_factor, model_load)
                or (self.max_in_flight > 0 and s.in_flight >= self.max_in_flight)
            ):
                continue
            score = key_score(key, s.id_hash)
            if score > best_score:
                best, best_score = slot, score
        return least if best == -1 else best

    def release(self, slot: int, failed: bool = False) -> bool:
        if slot < 0:
            return False
        with self._lock:
            if slot >= len(self._slots):
                return False
            now = self._now()
            s = self._slots[slot]
            if s.in_flight > 0:
                s.in_flight -= 1
            s.last_used_ns = now
            if s.model == _RETIRED:
                return False
            if not failed:
                s.consecutive_failures = 0
                return False
            s.consecutive_failures += 1
            if s.consecutive_failures >= self.failures_to_eject and s.ejected_until_ns == 0:
                return self._try_eject(s, now)
            return False

    def _try_eject(self, s: _Slot, now: int) -> bool:
        mdl = self._models[s.model]
        count = len(mdl.slots)
        allowed = min(max(1, count * self.max_ejection_percent // 100), count - 1)
        if mdl.ejected >= allowed:
            return False
        if s.last_ejection_end_ns != 0 and now - s.last_ejection_end_ns > self.max_ejection_ns:
            s.ejections = 0
        s.ejections += 1
        s.ejected_until_ns = now + min(self.base_ejection_ns * s.ejections, self.max_ejection_ns)
        s.consecutive_failures = 0
        mdl.ejected += 1
        self.ejections_total += 1
        return True

    def update(self, routes, version: int | None = None) -> None:
        wanted = normalise_routes(routes)
        with self._update_lock, self._lock:
            now = self._now()
            current = {
                (self._model_names[s.model], self._ids[slot]): slot
                for slot, s in enumerate(self._slots)
                if s.model != _RETIRED
            }
            reusable = [
                slot
                for slot in range(len(self._slots) - 1, -1, -1)
                if self._slots[slot].model == _RETIRED and self._slots[slot].in_flight == 0
            ]
            models = []
            for m, (name, endpoints) in enumerate(wanted.items()):
                mdl = _Model()
                for endpoint_id, url in endpoints:
                    slot = current.pop((name, endpoint_id), -1)
                    if slot == -1:
                        if reusable:
                            slot = reusable.pop()
                            self._slots[slot] = _Slot(m, now)
                        else:
                            slot = len(self._slots)
                            self._slots.append(_Slot(m, now))
                            self._ids.append(None)
                            self._urls.append(None)
                            self._gone_ids.append(None)
                        self._gone_ids[slot] = None
                    s = self._slots[slot]
                    s.model = m
                    s.id_hash = endpoint_hash(endpoint_id)
                    self._ids[slot] = endpoint_id
                    self._urls[slot] = url
                    mdl.slots.append(slot)
                    if s.ejected_until_ns != 0:
                        mdl.ejected += 1
                models.append(mdl)
            for slot in current.values():
                self._slots[slot].model = _RETIRED
                self._slots[slot].ejected_until_ns = 0
                self._gone_ids[slot] = self._ids[slot]
                self._ids[slot] = None
                self._urls[slot] = None
            self._models = models
            self._model_names = list(wanted)
            self._model_index = {name: m for m, name in enumerate(wanted)}
            self.version = self.version + 1 if version is None else version

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            t0 = time.monotonic_ns()
            now = self._now()
            raw = [
                (
                    self._ids[slot] if s.model != _RETIRED else self._gone_ids[slot],
                    s.model,
                    s.in_flight,
                    s.last_used_ns,
                    s.watched_since_ns,
                    s.picked,
                )
                for slot, s in enumerate(self._slots)
            ]
            self.last_snapshot_lock_ns = time.monotonic_ns() - t0
        used: dict[str, float] = {}
        watched: dict[str, float] = {}
        busy: dict[str, int] = {}
        picked: dict[str, int] = {}
        for endpoint_id, model, in_flight, last_used_ns, watched_since_ns, sent in raw:
            if model == _RETIRED:
                # Removed, but requests still on it: in use, and not to be stopped yet.
                if in_flight > 0 and endpoint_id is not None:
                    busy[endpoint_id] = busy.get(endpoint_id, 0) + in_flight
                    used[endpoint_id] = 0.0
                continue
            # One id may stand in two routes (a replica and its base's resolver route): the
            # longest watched and the latest use speak for it.
            seen = max(0.0, (now - watched_since_ns) / 1e9)
            watched[endpoint_id] = max(watched.get(endpoint_id, 0.0), seen)
            picked[endpoint_id] = picked.get(endpoint_id, 0) + sent
            if in_flight > 0:
                used[endpoint_id] = 0.0
                busy[endpoint_id] = busy.get(endpoint_id, 0) + in_flight
            elif last_used_ns != _NEVER:
                idle = max(0.0, (now - last_used_ns) / 1e9)
                used[endpoint_id] = min(used.get(endpoint_id, idle), idle)
        return {"used": used, "watched": watched, "in_flight": busy, "requests": picked}

    def load_targets(self, recent_s: float) -> list[tuple[int, str, str, int]]:
        with self._lock:
            since = self._now() - int(recent_s * 1e9)
            out = []
            for mdl in self._models:
                if self._model_is_recent(mdl, since):
                    out += [
                        (slot, self._ids[slot], self._urls[slot], self._slots[slot].in_flight)
                        for slot in mdl.slots
                    ]
            return out

    def recent_models(self, recent_s: float) -> list[str]:
        with self._lock:
            since = self._now() - int(recent_s * 1e9)
            return [
                name
                for name, mdl in zip(self._model_names, self._models, strict=True)
                if self._model_is_recent(mdl, since)
            ]

    def _model_is_recent(self, mdl: _Model, since: int) -> bool:
        slots = self._slots
        return any(
            slots[slot].in_flight > 0
            or (slots[slot].last_used_ns != _NEVER and slots[slot].last_used_ns >= since)
            for slot in mdl.slots
        )

    def set_load(
        self,
        slot: int,
        endpoint_id: str,
        waiting: int,
        running: int,
        kv_use: float,
        mark: int,
        valid_s: float,
    ) -> bool:
        with self._lock:
            if not 0 <= slot < len(self._slots) or self._slots[slot].model == _RETIRED:
                return False
            if self._ids[slot] != endpoint_id:
                return False
            s = self._slots[slot]
            s.engine_load = max(0, min(max(0, waiting) + max(0, running) - mark, 1 << 30))
            s.kv_full = kv_use > self.kv_threshold
            s.queueing = waiting > 0
            s.load_until_ns = self._now() + int(valid_s * 1e9)
            self._readings = True
            return True

    def load_of(self, slot: int) -> tuple[int, bool, bool]:
        with self._lock:
            if not 0 <= slot < len(self._slots):
                return 0, False, False
            now, s = self._now(), self._slots[slot]
            return _load(s, now), s.load_until_ns > now, _kv_full(s, now)

    def endpoint_id(self, slot: int) -> str | None:
        if not 0 <= slot < len(self._ids):
            raise IndexError(f"no slot {slot}")
        return self._ids[slot]

    def endpoint_url(self, slot: int) -> str | None:
        if not 0 <= slot < len(self._urls):
            raise IndexError(f"no slot {slot}")
        return self._urls[slot]

    def in_flight(self, slot: int) -> int:
        with self._lock:
            return self._slots[slot].in_flight if 0 <= slot < len(self._slots) else 0

    def is_ejected(self, slot: int) -> bool:
        with self._lock:
            if not 0 <= slot < len(self._slots):
                return False
            until = self._slots[slot].ejected_until_ns
            return until != 0 and until > self._now()

    def models(self) -> list[str]:
        return list(self._model_names)

    def endpoints(self, model: str) -> list[tuple[int, str, str]]:
        with self._lock:
            m = self._model_index.get(model)
            if m is None:
                return []
            return [(slot, self._ids[slot], self._urls[slot]) for slot in self._models[m].slots]

    def noop(self, argument=None, key=0) -> int:
        return 0


def normalise_routes(routes) -> dict[str, list[tuple[str, str]]]:
    """{model: [endpoint, ...]} -> {model: [(id, url), ...]}, refusing duplicates.

    An endpoint is an (id, url) pair, a {"id", "url"} mapping, or an object with .id and .url.
    """
    wanted: dict[str, list[tuple[str, str]]] = {}
    for model, endpoints in routes.items():
        if not isinstance(model, str) or not model:
            raise ValueError(f"model names must be non-empty strings, got {model!r}")
        pairs = []
        seen = set()
        for endpoint in endpoints:
            if isinstance(endpoint, dict):
                endpoint_id, url = endpoint["id"], endpoint["url"]
            elif isinstance(endpoint, tuple | list):
                endpoint_id, url = endpoint
            else:
                endpoint_id, url = endpoint.id, endpoint.url
            if endpoint_id in seen:
                raise ValueError(f"endpoint {endpoint_id!r} appears twice in model {model!r}")
            seen.add(endpoint_id)
            pairs.append((str(endpoint_id), str(url)))
        wanted[model] = pairs
    return wanted

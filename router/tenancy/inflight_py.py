"""The interpreted twin of router/tenancy/_inflight.pyx: the same cells in a shared mapping,
each change made under one lock that the forked workers share."""

from __future__ import annotations

import hashlib
import mmap
import multiprocessing
import struct

CAPACITY = 4096  # tenants a router's workers can count together
WORD = struct.Struct("<q")


def name_key(name: str) -> int:
    """A tenant's cell key (both implementations'): never 0, which marks a free cell."""
    key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return (key & 0x7FFFFFFFFFFFFFFF) or 1


class SharedInFlight:
    def __init__(self, workers: int, capacity: int = CAPACITY) -> None:
        if workers < 1 or capacity < 1:
            raise ValueError("at least one worker and one cell")
        self.workers = workers
        self.capacity = capacity
        self._stride = 2 + workers
        self._map = mmap.mmap(-1, capacity * self._stride * 8)
        self._lock = multiprocessing.Lock()  # a semaphore: shared with the forked workers
        self.worker = 0

    def _get(self, word: int) -> int:
        return WORD.unpack_from(self._map, word * 8)[0]

    def _add(self, word: int, value: int) -> None:
        WORD.pack_into(self._map, word * 8, self._get(word) + value)

    def cell(self, name: str) -> int:
        key = name_key(name)
        with self._lock:
            for i in range(self.capacity):
                cell = (key % self.capacity + i) % self.capacity
                held = self._get(cell * self._stride)
                if held == key:
                    return cell
                if held == 0:
                    WORD.pack_into(self._map, cell * self._stride * 8, key)
                    return cell
        return -1

    def acquire(self, cell: int, limit: int) -> bool:
        base = cell * self._stride
        with self._lock:
            if self._get(base + 1) >= limit:
                return False
            self._add(base + 1, 1)
            self._add(base + 2 + self.worker, 1)
            return True

    def release(self, cell: int) -> None:
        base = cell * self._stride
        with self._lock:
            self._add(base + 1, -1)
            self._add(base + 2 + self.worker, -1)

    def total(self, cell: int) -> int:
        return self._get(cell * self._stride + 1)

    def reclaim(self, worker: int) -> int:
        if not 0 <= worker < self.workers:
            raise ValueError(f"no worker {worker}")
        freed = 0
        with self._lock:
            for cell in range(self.capacity):
                part = cell * self._stride + 2 + worker
                held = self._get(part)
                if held:
                    WORD.pack_into(self._map, part * 8, 0)
                    self._add(cell * self._stride + 1, -held)
                    freed += held
        return freed

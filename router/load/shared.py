"""One engine reader per router process, however many workers it has.

With `--workers N`, worker 0 reads the engines (router/load/engineload.py, as a router of one
worker does) for every worker; the others read none. Through two kinds of files in the
workers' shared folder:

- `wanted-K.json`: the engine URLs worker K sent to lately (its `load_targets`), written when
  they change; worker 0 reads them once a round, when their files changed, and reads the union
  of theirs and its own;
- `readings.json`: what worker 0 last read, URL by URL ([waiting, running, KV use, when, valid
  for]) and its read counters, written once a round; every other worker applies the readings of
  its own targets once an interval, marking them with its own requests in flight (an engine's
  other requests, for it, include those of its sibling workers).

So reads per engine per second are one reader's, whatever N (DESIGN: a router process reads
each engine at most once an interval); a reading reaches the other workers within an interval
and is used for what is left of its validity.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import orjson

from router.load.engineload import RECENT_S, SLOT_SEP, STALE_INTERVALS, load_metrics_lines

READINGS = "readings.json"


class SharedReadings:
    """The files one worker writes and reads."""

    def __init__(self, folder: str, worker: int) -> None:
        self.folder = Path(folder)
        self.worker = worker
        self.wanted_path = self.folder / f"wanted-{worker}.json"
        self.readings_path = self.folder / READINGS
        self._said: tuple = ()
        self._wanted_seen: dict[Path, tuple[int, list[str]]] = {}
        self._readings_seen: tuple[int, dict] = (0, {})

    def _write(self, path: Path, value) -> None:
        staging = path.with_suffix(f".{self.worker}.tmp")
        staging.write_bytes(orjson.dumps(value))
        os.replace(staging, path)  # readers never see half a file

    def _read(self, path: Path, seen: tuple[int, object] | None):
        """(mtime, parsed) of `path`, parsed again only when it changed; None when absent."""
        try:
            changed = path.stat().st_mtime_ns
        except OSError:
            return None
        if seen is not None and seen[0] == changed:
            return seen
        try:
            return changed, orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return seen

    # A worker other than the reader.

    def want(self, urls: tuple) -> None:
        if urls != self._said:
            self._write(self.wanted_path, list(urls))
            self._said = urls

    def latest(self) -> dict:
        seen = self._read(self.readings_path, self._readings_seen)
        if seen is not None:
            self._readings_seen = seen
        return self._readings_seen[1]

    # The reader.

    def wanted(self) -> set[str]:
        """Every other worker's engine URLs."""
        urls: set[str] = set()
        for path in self.folder.glob("wanted-*.json"):
            seen = self._read(path, self._wanted_seen.get(path))
            if seen is None:
                continue
            self._wanted_seen[path] = seen
            urls.update(url for url in seen[1] if isinstance(url, str))
        return urls

    def publish(self, readings: dict, outcomes: dict, busy_s: float, quiet: int, read: int) -> None:
        self._write(
            self.readings_path,
            {"readings": readings, "outcomes": outcomes, "busy_s": busy_s, "quiet": quiet,
             "read": read},
        )  # fmt: skip


class LoadFollower:
    """A worker's engine load taken from the reader worker's readings: no engine is read here.
    The same face as LoadReader to the rest of the worker."""

    def __init__(
        self, table, shared: SharedReadings, interval_s: float = 0.1, recent_s: float = RECENT_S
    ) -> None:
        self.table = table
        self.shared = shared
        self.interval_s = interval_s
        self.valid_s = STALE_INTERVALS * interval_s
        self.recent_s = recent_s
        self.targets: list[tuple[int, str, str, int]] = []
        self.applied: dict[str, tuple] = {}  # url -> the reading applied last
        self.round_timer = None
        self.loop = None
        self.busy_s = 0.0

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.round_timer = self.loop.call_soon(self.round)

    def stop(self) -> None:
        if self.round_timer is not None:
            self.round_timer.cancel()

    def round(self) -> None:
        began = time.perf_counter()
        self.targets = [t for t in self.table.load_targets(self.recent_s) if t[2] is not None]
        self.shared.want(tuple(sorted({url for _, _, url, _ in self.targets})))
        readings = self.shared.latest().get("readings", {})
        now = time.monotonic()
        for slot, endpoint_id, url, in_flight in self.targets:
            reading = readings.get(url)
            if not reading:
                continue
            waiting, running, kv_use, at, valid_s = reading
            left = at + valid_s - now
            if left > 0:
                self.table.set_load(slot, endpoint_id, waiting, running, kv_use, in_flight, left)
                self.applied[url] = reading
        jitter = self.interval_s * random.uniform(0.9, 1.1)
        self.round_timer = self.loop.call_later(jitter, self.round)
        self.busy_s += time.perf_counter() - began

    @property
    def stale(self) -> int:
        load_of = self.table.load_of
        return sum(1 for slot, _, _, _ in self.targets if not load_of(slot)[1])

    def report(self) -> dict[str, list]:
        """As LoadReader.report: replica -> [waiting, running, KV use, seconds since read]."""
        now = time.monotonic()
        fresh = {}
        for _, endpoint_id, url, _ in self.targets:
            reading = self.applied.get(url)
            if reading and now - reading[3] <= self.valid_s * 10:
                waiting, running, kv_use, at, _ = reading
                replica = endpoint_id.partition(SLOT_SEP)[0]
                fresh[replica] = [waiting, running, round(kv_use, 4), round(now - at, 3)]
        return fresh

    def metrics_lines(self) -> list[str]:
        """The reads are the reader worker's, and so are the counters (the process's, whichever
        worker answers the scrape: they never go back); the stale endpoints are this worker's."""
        said = self.shared.latest()
        return load_metrics_lines(
            said.get("outcomes", {}),
            self.stale,
            said.get("quiet", 0),
            said.get("read", 0),
            said.get("busy_s", 0.0),
        )

"""The engines' own load, read off the request path: what each replica's engine says it is
running and holding in its queue, and how full its KV cache is.

Every `interval` (jittered by ±10%) the reader takes from the table the endpoints of the models
this router sent to in the last minute (`EndpointTable.load_targets`), GETs each distinct URL's
`/metrics` over a kept-alive connection, at most `concurrency` at once, and gives what it
reads to the table (`set_load`), which picks use for three intervals. Nothing here awaits on a
request's behalf: a read is a write and a few callbacks on the router's loop, with no task of
its own. A read that has not answered by the next round's deadline (two intervals) is
abandoned and its connection closed; a body over `max_bytes` is cut off; a page that names
none of the series, or gives one a value that is not a finite non-negative number, gives no
reading. Without a reading the replica's load is this router's own count again, as before.

Series, summed over their label sets (an engine with data-parallel ranks exports one each),
the KV use as the largest:

| engine    | waiting                    | running                      | KV-cache use (1: full)   |
|-----------|----------------------------|------------------------------|--------------------------|
| vLLM      | vllm:num_requests_waiting  | vllm:num_requests_running    | vllm:kv_cache_usage_perc |
|           |                            |                              | (vllm:gpu_cache_usage_…) |
| SGLang    | sglang:num_queue_reqs      | sglang:num_running_reqs      | sglang:token_usage       |
| llama.cpp | llamacpp:requests_deferred | llamacpp:requests_processing | llamacpp:kv_cache_usage_ |
|           |                            |                              | ratio                    |
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import time
from collections import deque
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

log = logging.getLogger("gpurouter.engineload")

WAITING, RUNNING, KV = 0, 1, 2
SERIES = {
    b"vllm:num_requests_waiting": WAITING,
    b"vllm:num_requests_running": RUNNING,
    b"vllm:kv_cache_usage_perc": KV,
    b"vllm:gpu_cache_usage_perc": KV,
    b"sglang:num_queue_reqs": WAITING,
    b"sglang:num_running_reqs": RUNNING,
    b"sglang:token_usage": KV,
    b"llamacpp:requests_deferred": WAITING,
    b"llamacpp:requests_processing": RUNNING,
    b"llamacpp:kv_cache_usage_ratio": KV,
}
OUTCOMES = ("ok", "timeout", "error", "http_error", "too_large", "bad_value", "no_series")
RECENT_S = 60.0  # models sent to within this long have their replicas read
STALE_INTERVALS = 3  # a reading is used this many intervals, then own counts again
SLOT_SEP = "@"  # an adapter's endpoint is REPLICA@ADAPTER, on its replica's engine


class BadReading(ValueError):
    pass


class Reading(NamedTuple):
    waiting: int
    running: int
    kv_use: float


# One pass over the page, in C: a known name at the start of a line, its labels, its value.
SAMPLE = re.compile(
    rb"^(" + b"|".join(re.escape(name) for name in SERIES) + rb")(\{[^\n]*?\})?[ \t]+(\S*)", re.M
)


def parse_load(page: bytes) -> Reading | None:
    """The load a Prometheus text page gives, looking only for the known series; None when it
    names none of them; BadReading when one's value is not a finite non-negative number."""
    totals = [0.0, 0.0, 0.0]
    seen = False
    for name, _, raw in SAMPLE.findall(page):
        try:
            value = float(raw)
        except ValueError:
            raise BadReading(f"not a number: {raw[:20]!r}") from None
        if not math.isfinite(value) or value < 0:
            raise BadReading(f"not a finite non-negative number: {value}")
        field = SERIES[name]
        if field == KV:
            totals[KV] = max(totals[KV], value)
        else:
            totals[field] += value
        seen = True
    if not seen:
        return None
    return Reading(int(totals[WAITING]), int(totals[RUNNING]), min(totals[KV], 1.0))


class _Connection(asyncio.Protocol):
    """One kept-alive connection to one engine, one GET /metrics at a time."""

    def __init__(self, reader: LoadReader, url: str, request: bytes) -> None:
        self.reader = reader
        self.url = url
        self.request = request
        parts = urlsplit(url)
        self.address = (parts.hostname, parts.port or 80)
        self.transport: asyncio.Transport | None = None
        self.connecting = False
        # The connect under way: cancelled when the read is given up, since a connect to an
        # engine that drops packets would otherwise hold its socket for the kernel's minutes.
        self.opening: asyncio.Future | None = None
        self.closed = False
        self.busy = False
        self.started = 0.0
        self.status = 0
        self.size = 0
        self.chunks: list[bytes] = []
        self.parser = httptools.HttpResponseParser(self)

    def send(self) -> None:
        self.busy = True
        self.started = time.monotonic()
        self.status, self.size, self.chunks = 0, 0, []
        if self.transport is not None:
            self.transport.write(self.request)

    def connection_made(self, transport) -> None:
        if self.closed:  # given up while it connected
            transport.abort()
            return
        self.transport = transport
        self.connecting = False
        if self.busy:
            transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.close()  # nothing was asked: not an engine speaking HTTP as it should
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.finish("error")
            self.close()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.reader.max_bytes:
            self.finish("too_large")
            self.close()
            return
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if not self.busy:
            return
        if self.status != 200:
            self.finish("http_error")
            return
        page = b"".join(self.chunks)
        self.chunks = []
        self.finish("ok", page)
        if not self.parser.should_keep_alive():
            self.close()

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.connecting = False
        self.parser = httptools.HttpResponseParser(self)
        if self.busy:
            self.finish("error")

    def finish(self, outcome: str, page: bytes | None = None) -> None:
        if self.busy:
            self.busy = False
            self.reader.done(self, outcome, page)

    def close(self) -> None:
        """Drop the connection and any connect under way; the next read of this URL opens a
        new one."""
        self.closed = True
        self.reader.forget(self)
        opening, self.opening = self.opening, None
        if opening is not None and not opening.done():
            opening.cancel()
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.abort()


class LoadReader:
    def __init__(
        self,
        table,
        interval_s: float = 0.1,
        concurrency: int = 64,
        max_bytes: int = 2 * 1024 * 1024,
        recent_s: float = RECENT_S,
    ) -> None:
        self.table = table
        self.interval_s = interval_s
        self.timeout_s = 2 * interval_s
        self.valid_s = STALE_INTERVALS * interval_s
        self.concurrency = concurrency
        self.max_bytes = max_bytes
        self.recent_s = recent_s
        self.connections: dict[str, _Connection] = {}
        # url -> [(slot, id, this router's requests on it at the start of the round)]
        self.targets: dict[str, list[tuple[int, str, int]]] = {}
        self.pending: deque[str] = deque()
        self.outstanding = 0
        self.round_timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        # What the operator and the control plane are told.
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.busy_s = 0.0  # time spent in the reader's own code, rounds and readings
        self.rounds = 0
        self.readings: dict[str, tuple[int, int, float, float]] = {}  # replica -> (w, r, kv, at)
        self.stale = 0  # endpoints read last round that picks count on their own counts

    # The rounds.

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.round_timer = self.loop.call_soon(self.round)

    def stop(self) -> None:
        if self.round_timer is not None:
            self.round_timer.cancel()
        for connection in list(self.connections.values()):
            connection.close()

    def round(self) -> None:
        began = time.perf_counter()
        self.rounds += 1
        now = time.monotonic()
        for connection in list(self.connections.values()):
            if connection.busy and now - connection.started > self.timeout_s:
                connection.finish("timeout")
                connection.close()
        targets: dict[str, list[tuple[int, str, int]]] = {}
        for slot, endpoint_id, url, mark in self.table.load_targets(self.recent_s):
            if url is not None:
                targets.setdefault(url, []).append((slot, endpoint_id, mark))
        self.targets = targets
        for url in [url for url in self.connections if url not in targets]:
            self.connections[url].close()
        load_of = self.table.load_of
        self.stale = sum(
            1 for entries in targets.values() for slot, _, _ in entries if not load_of(slot)[1]
        )
        for url in targets:
            connection = self.connections.get(url)
            if connection is None or not connection.busy:
                self.pending.append(url)
        self.pump()
        jitter = self.interval_s * random.uniform(0.9, 1.1)
        self.round_timer = self.loop.call_later(jitter, self.round)
        self.busy_s += time.perf_counter() - began

    def pump(self) -> None:
        while self.pending and self.outstanding < self.concurrency:
            url = self.pending.popleft()
            if url not in self.targets:
                continue
            connection = self.connections.get(url)
            if connection is None:
                connection = self._connection(url)
                if connection is None:
                    self.outcomes["error"] += 1
                    continue
            if connection.busy:
                continue
            self.outstanding += 1
            connection.send()
            if connection.transport is None and not connection.connecting:
                self._connect(connection)

    def _connection(self, url: str) -> _Connection | None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            return None  # https engines are not read: their load stays this router's count
        path = parts.path.rstrip("/") + "/metrics"
        host = parts.netloc
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/plain\r\n"
            "User-Agent: gpurouter-load\r\n\r\n"
        ).encode()
        connection = _Connection(self, url, request)
        self.connections[url] = connection
        return connection

    def _connect(self, connection: _Connection) -> None:
        connection.connecting = True
        host, port = connection.address
        opening = asyncio.ensure_future(self.loop.create_connection(lambda: connection, host, port))
        connection.opening = opening

        def opened(future: asyncio.Future) -> None:
            if connection.opening is future:
                connection.opening = None
            if future.cancelled() or future.exception() is not None:
                connection.connecting = False
                connection.finish("error")
                self.forget(connection)

        opening.add_done_callback(opened)

    def forget(self, connection: _Connection) -> None:
        if self.connections.get(connection.url) is connection:
            del self.connections[connection.url]

    def done(self, connection: _Connection, outcome: str, page: bytes | None = None) -> None:
        began = time.perf_counter()
        self.outstanding -= 1
        if outcome == "ok":
            try:
                reading = parse_load(page)
            except BadReading:
                outcome, reading = "bad_value", None
            else:
                if reading is None:
                    outcome = "no_series"
            if reading is not None:
                self._take(connection.url, reading)
        self.outcomes[outcome] += 1
        self.pump()
        self.busy_s += time.perf_counter() - began

    def _take(self, url: str, reading: Reading) -> None:
        at = time.time()
        for slot, endpoint_id, mark in self.targets.get(url, ()):
            self.table.set_load(
                slot,
                endpoint_id,
                reading.waiting,
                reading.running,
                reading.kv_use,
                mark,
                self.valid_s,
            )
            replica = endpoint_id.partition(SLOT_SEP)[0]
            self.readings[replica] = (reading.waiting, reading.running, reading.kv_use, at)

    # What is told.

    def report(self) -> dict[str, list]:
        """replica -> [waiting, running, KV use, seconds since read], for the activity report:
        the readings still fresh enough to use, for replicas still read."""
        now = time.time()
        read = {
            endpoint_id.partition(SLOT_SEP)[0]
            for entries in self.targets.values()
            for _, endpoint_id, _ in entries
        }
        fresh = {}
        for replica, (waiting, running, kv_use, at) in list(self.readings.items()):
            if replica not in read:
                del self.readings[replica]
            elif now - at <= self.valid_s * 10:
                fresh[replica] = [waiting, running, round(kv_use, 4), round(now - at, 3)]
        return fresh

    def metrics_lines(self) -> list[str]:
        lines = [
            "# HELP gpurouter_engine_load_reads_total Reads of the engines' load, by outcome.",
            "# TYPE gpurouter_engine_load_reads_total counter",
        ]
        lines += [
            f'gpurouter_engine_load_reads_total{{outcome="{outcome}"}} {count}'
            for outcome, count in self.outcomes.items()
        ]
        lines += [
            "# HELP gpurouter_engine_load_stale_endpoints Endpoints read whose last reading is"
            " too old or missing: picks count this router's own requests on them.",
            "# TYPE gpurouter_engine_load_stale_endpoints gauge",
            f"gpurouter_engine_load_stale_endpoints {self.stale}",
            "# HELP gpurouter_engine_load_read_endpoints Endpoints the reader reads.",
            "# TYPE gpurouter_engine_load_read_endpoints gauge",
            f"gpurouter_engine_load_read_endpoints {sum(len(e) for e in self.targets.values())}",
            "# HELP gpurouter_engine_load_busy_seconds_total Time spent in the reader's own"
            " code (rounds, parsing, readings), not counting the loop's I/O.",
            "# TYPE gpurouter_engine_load_busy_seconds_total counter",
            f"gpurouter_engine_load_busy_seconds_total {self.busy_s:.6f}",
        ]
        return lines

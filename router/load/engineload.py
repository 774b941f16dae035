"""The engines' own load, read off the request path: what each replica's engine says it is
running and holding in its queue, and how full its KV cache is.

Every `interval` (jittered by ±10%) the reader takes from the table the endpoints of the models
this router sent to in the last minute (`EndpointTable.load_targets`), GETs each distinct URL's
`/metrics` over a kept-alive connection, at most `concurrency` at once, and gives what it reads
to the table (`set_load`), which picks use for three intervals. Nothing here awaits on a
request's behalf: a read is a write and a few callbacks on the router's loop, with no task of
its own. Only what changes is read each round: an engine whose reading came back the same
QUIET_AFTER times running, with this router's requests on it the same, is read every QUIET_EVERY
rounds, then every twice as many as it stays the same, up to every QUIET_MOST_S, until it
changes (its reading is used that much longer meanwhile; this router's own requests on it are
counted live as ever, so what waits is only another router's new load on an engine that had
none, for at most QUIET_MOST_S). A read that has not answered by the
next round's deadline (two intervals) is abandoned and its connection closed; a body over
`max_bytes` is cut off; a page that names none of the series, or gives one a value that is not a
finite non-negative number, gives no reading. Without a reading the replica's load is this
router's own count again, as before.

The page is read in C (router/load/_loadread.pyx: llhttp frames the answer, and only the known
series are looked for, router/load/loadseries.py); the connection's own work is a few calls a read.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from urllib.parse import urlsplit

from router.load.loadread import PageReader
from router.load.loadseries import COMPLETE, NEED_MORE, TOO_LARGE, BadReading, Reading

log = logging.getLogger("gpurouter.engineload")

OUTCOMES = ("ok", "timeout", "error", "http_error", "too_large", "bad_value", "no_series")
RECENT_S = 60.0  # models sent to within this long have their replicas read
STALE_INTERVALS = 3  # a reading is used this many intervals, then own counts again
# An engine whose reading (and this router's requests on it) came back the same this many
# times running is quiet: read every QUIET_EVERY rounds, then, as it stays the same, every
# twice as many, up to one read every QUIET_MOST_S; the first change brings it back to every
# round. 1,000 idle engines at the default 0.1 s: 333 reads a second, not 10,000.
QUIET_AFTER = 3
QUIET_EVERY = 4
QUIET_MOST_S = 3.0
SLOT_SEP = "@"  # an adapter's endpoint is REPLICA@ADAPTER, on its replica's engine
# The endpoints to read are taken from the table this often (and at each new route version): a
# model first sent to has its replicas read within half a second at the default interval.
REFRESH_ROUNDS = 5


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
        self.page = PageReader(reader.max_bytes)
        # What its last reading said (with this router's requests on it then), how many times
        # running it said the same, and in which round it was last asked.
        self.last: tuple | None = None
        self.same = 0
        self.asked_in = 0
        # Its endpoints as it was asked: [(slot, id, this router's requests on it then)]
        self.asked: list[tuple[int, str, int]] = []

    def send(self) -> None:
        self.busy = True
        self.started = time.monotonic()
        self.page.next()
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
        said = self.page.feed(data)
        if said != NEED_MORE:
            self.answered(said)

    def eof_received(self) -> bool:
        if self.busy:
            self.answered(self.page.feed_eof())
        return False  # the transport closes itself

    def answered(self, said: int) -> None:
        page = self.page
        if said == COMPLETE:
            self.finish("ok" if page.status == 200 else "http_error")
            if not page.keep_alive:
                self.close()
        else:
            self.finish("too_large" if said == TOO_LARGE else "error")
            self.close()

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.connecting = False
        self.page = PageReader(self.reader.max_bytes)  # a new connection, a new answer
        if self.busy:
            self.finish("error")

    def finish(self, outcome: str) -> None:
        if self.busy:
            self.busy = False
            self.reader.done(self, outcome)

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
        max_bytes: int = 1024 * 1024,  # a real engine's page is 40 to 100 KB
        recent_s: float = RECENT_S,
        shared=None,
    ) -> None:
        """`shared` (router/load/shared.py's SharedReadings): this is worker 0 of several, and
        reads the engines its sibling workers want too, for them."""
        self.table = table
        self.shared = shared
        self.latest: dict[str, list] = {}  # url -> [waiting, running, KV use, when, valid for]
        self.unpublished = False
        self.interval_s = interval_s
        self.timeout_s = 2 * interval_s
        self.valid_s = STALE_INTERVALS * interval_s
        self.concurrency = concurrency
        self.max_bytes = max_bytes
        self.recent_s = recent_s
        self.connections: dict[str, _Connection] = {}
        # url -> [(slot, id)]: the endpoints of the models sent to lately, taken from the table
        # every REFRESH_ROUNDS rounds and at each new route version.
        self.targets: dict[str, list[tuple[int, str]]] = {}
        self.refreshed_in = 0
        self.version_seen = None
        self.targets_from: tuple | None = None  # what `targets` was last built from
        # When each URL is read next (a round), and the URLs due in each round: a round touches
        # only what is due, not every engine (1,000 quiet engines cost a round nothing).
        self.next_read: dict[str, int] = {}
        self.due: dict[int, list[str]] = {}
        self.reading: set[_Connection] = set()  # asked, not answered yet
        self.pending: deque[str] = deque()
        self.outstanding = 0
        self.round_timer: asyncio.TimerHandle | None = None
        self.stopped = False
        self.loop: asyncio.AbstractEventLoop | None = None
        # What the operator and the control plane are told.
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.busy_s = 0.0  # time spent in the reader's own code, rounds and readings
        self.rounds = 0
        self.readings: dict[str, tuple[int, int, float, float]] = {}  # replica -> (w, r, kv, at)
        self.quiet_most = max(QUIET_EVERY, round(QUIET_MOST_S / interval_s))  # in rounds

    # The rounds.

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.round_timer = self.loop.call_soon(self.round)

    def stop(self) -> None:
        # Closing a connection that is being read finishes its read, which pumps: once stopped,
        # nothing is sent and no connection opened again.
        self.stopped = True
        if self.round_timer is not None:
            self.round_timer.cancel()
        for connection in list(self.connections.values()):
            connection.close()

    def round(self) -> None:
        began = time.perf_counter()
        self.rounds += 1
        now = time.monotonic()
        for connection in [c for c in self.reading if now - c.started > self.timeout_s]:
            connection.finish("timeout")
            connection.close()
        version = self.table.version
        if self.rounds - self.refreshed_in >= REFRESH_ROUNDS or version != self.version_seen:
            self.refresh(now)
            self.version_seen = version
        next_read = self.next_read
        for url in self.due.pop(self.rounds, ()):
            if next_read.get(url) == self.rounds:
                self.pending.append(url)
        self.pump()
        jitter = self.interval_s * random.uniform(0.9, 1.1)
        self.round_timer = self.loop.call_later(jitter, self.round)
        self.busy_s += time.perf_counter() - began

    def refresh(self, now: float) -> None:
        """The endpoints to read, afresh from the table (and the sibling workers' wants): new
        URLs are read this round, those gone are forgotten and their connections closed."""
        self.refreshed_in = self.rounds
        wanted = frozenset()
        if self.shared is not None:
            wanted = frozenset(self.shared.wanted())
            if self.unpublished:
                self.publish(now)
        # The targets follow from these alone: 1,000 endpoints are not gone over again twice a
        # second while nothing changed (a hundredth of a core at the default interval).
        source = (self.table.version, self.table.recent_models(self.recent_s), wanted)
        if source == self.targets_from:
            return
        self.targets_from = source
        targets: dict[str, list[tuple[int, str]]] = {}
        for slot, endpoint_id, url, _ in self.table.load_targets(self.recent_s):
            if url is not None:
                targets.setdefault(url, []).append((slot, endpoint_id))
        for url in wanted:
            targets.setdefault(url, [])  # read for a sibling worker
        self.targets = targets
        for url in [url for url in self.connections if url not in targets]:
            self.connections[url].close()
        for url in [url for url in self.next_read if url not in targets]:
            del self.next_read[url]
        for url in targets:
            if url not in self.next_read:
                self.schedule(url, 0)

    def schedule(self, url: str, after: int) -> None:
        at = self.rounds + after
        self.next_read[url] = at
        self.due.setdefault(at, []).append(url)

    @property
    def quiet(self) -> int:
        """Engines read every few rounds, their reading unchanged."""
        return sum(1 for c in self.connections.values() if c.same >= QUIET_AFTER)

    def quiet_gap(self, same: int) -> int:
        """Rounds between reads of an engine that said the same `same` times running."""
        doublings = min(same - QUIET_AFTER, 8)
        return min(QUIET_EVERY << doublings, self.quiet_most)

    def pump(self) -> None:
        if self.stopped:
            return
        while self.pending and self.outstanding < self.concurrency:
            url = self.pending.popleft()
            if url not in self.targets:
                continue
            connection = self.connections.get(url)
            if connection is None:
                connection = self._connection(url)
                if connection is None:
                    self.outcomes["error"] += 1  # and not read again while it is a target
                    continue
            if connection.busy:
                continue
            in_flight = self.table.in_flight
            connection.asked = [
                (slot, endpoint_id, in_flight(slot)) for slot, endpoint_id in self.targets[url]
            ]
            connection.asked_in = self.rounds
            self.outstanding += 1
            self.reading.add(connection)
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

    def done(self, connection: _Connection, outcome: str) -> None:
        began = time.perf_counter()
        self.outstanding -= 1
        self.reading.discard(connection)
        if outcome != "ok":
            connection.same = 0
        if outcome == "ok":
            try:
                reading = connection.page.reading()
            except BadReading:
                outcome, reading = "bad_value", None
            else:
                if reading is None:
                    outcome = "no_series"
            if reading is not None:
                self._take(connection, reading)
        self.outcomes[outcome] += 1
        if connection.url in self.targets:
            quiet = connection.same >= QUIET_AFTER
            self.schedule(connection.url, self.quiet_gap(connection.same) if quiet else 1)
        self.pump()
        if self.shared is not None and self.unpublished and not self.outstanding:
            self.publish(time.monotonic())  # the round's last read is in: out to the workers
        self.busy_s += time.perf_counter() - began

    def publish(self, now: float) -> None:
        gone = [u for u, r in self.latest.items() if r[3] + r[4] < now or u not in self.targets]
        for url in gone:
            del self.latest[url]
        self.shared.publish(self.latest, self.outcomes, self.busy_s, self.quiet, self.read_count)
        self.unpublished = False

    def _take(self, connection: _Connection, reading: Reading) -> None:
        at = time.time()
        entries = connection.asked
        said = (reading, sum(mark for _, _, mark in entries))
        connection.same = connection.same + 1 if said == connection.last else 0
        connection.last = said
        valid_s = self.valid_s
        if connection.same >= QUIET_AFTER:  # used until its next read is due, and two more
            valid_s = (self.quiet_gap(connection.same) + 2) * self.interval_s
        if self.shared is not None:
            self.latest[connection.url] = [
                reading.waiting, reading.running, reading.kv_use, time.monotonic(), valid_s
            ]
            self.unpublished = True
        for slot, endpoint_id, mark in entries:
            self.table.set_load(
                slot,
                endpoint_id,
                reading.waiting,
                reading.running,
                reading.kv_use,
                mark,
                valid_s,
            )
            replica = endpoint_id.partition(SLOT_SEP)[0]
            self.readings[replica] = (reading.waiting, reading.running, reading.kv_use, at)

    # What is told.

    @property
    def stale(self) -> int:
        """Endpoints read whose last reading is too old or missing: picks count this router's
        own requests on them (worked out when asked: the rounds need not)."""
        load_of = self.table.load_of
        return sum(
            1 for entries in self.targets.values() for slot, _ in entries if not load_of(slot)[1]
        )

    def report(self) -> dict[str, list]:
        """replica -> [waiting, running, KV use, seconds since read], for the activity report:
        the readings still fresh enough to use, for replicas still read."""
        now = time.time()
        read = {
            endpoint_id.partition(SLOT_SEP)[0]
            for entries in self.targets.values()
            for _, endpoint_id in entries
        }
        fresh = {}
        for replica, (waiting, running, kv_use, at) in list(self.readings.items()):
            if replica not in read:
                del self.readings[replica]
            elif now - at <= self.valid_s * 10:
                fresh[replica] = [waiting, running, round(kv_use, 4), round(now - at, 3)]
        return fresh

    @property
    def read_count(self) -> int:
        return sum(max(1, len(e)) for e in self.targets.values())

    def metrics_lines(self) -> list[str]:
        return load_metrics_lines(
            self.outcomes, self.stale, self.quiet, self.read_count, self.busy_s
        )


def load_metrics_lines(
    outcomes: dict, stale: int, quiet: int, read: int, busy_s: float
) -> list[str]:
    """The reader's families: with several workers, its counters are the reading worker's,
    whichever worker answers (router/load/shared.py)."""
    lines = [
        "# HELP gpurouter_engine_load_reads_total Reads of the engines' load, by outcome.",
        "# TYPE gpurouter_engine_load_reads_total counter",
    ]
    lines += [
        f'gpurouter_engine_load_reads_total{{outcome="{outcome}"}} {count}'
        for outcome, count in outcomes.items()
    ]
    lines += [
        "# HELP gpurouter_engine_load_stale_endpoints Endpoints read whose last reading is"
        " too old or missing: picks count this router's own requests on them.",
        "# TYPE gpurouter_engine_load_stale_endpoints gauge",
        f"gpurouter_engine_load_stale_endpoints {stale}",
        "# HELP gpurouter_engine_load_quiet_engines Engines whose reading has not changed:"
        " read every few rounds until it does.",
        "# TYPE gpurouter_engine_load_quiet_engines gauge",
        f"gpurouter_engine_load_quiet_engines {quiet}",
        "# HELP gpurouter_engine_load_read_endpoints Endpoints the reader reads.",
        "# TYPE gpurouter_engine_load_read_endpoints gauge",
        f"gpurouter_engine_load_read_endpoints {read}",
        "# HELP gpurouter_engine_load_busy_seconds_total Time spent in the reader's own"
        " code (rounds, parsing, readings), not counting the loop's I/O.",
        "# TYPE gpurouter_engine_load_busy_seconds_total counter",
        f"gpurouter_engine_load_busy_seconds_total {busy_s:.6f}",
    ]
    return lines

"""Prometheus text metrics of the router, kept in plain dicts and rendered on scrape.

Labels come from the router's own vocabulary only: model names it routes (anything else a
client sends is counted under `OTHER_MODEL`), replica ids from its routes, fixed kinds and
status classes. Label values are escaped as the exposition format asks all the same.

With `--workers N` every worker writes its counters to a shared folder once a tick and when
scraped, and a scrape of any worker answers the sum of all of them: Prometheus sees one
router whose counters only grow, whichever worker it reaches.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from router.control.resolvers import served

# LLM latencies: a cached short answer in tens of ms, long generations in minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# From the first parked request to its model's first replica: a start-up, seconds to minutes.
WAKE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
OTHER_MODEL = "(unrouted)"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Histogram:
    """Attributes typed in metrics.pxd."""

    def __init__(self, buckets: tuple) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # Most values fall in the first few buckets: a scan from the bottom stops early.
        at = 0
        for bound in self.buckets:
            if value <= bound:
                break
            at += 1
        self.counts[at] += 1
        self.total += value
        self.count += 1

    def values(self) -> list[float]:
        return [*self.counts, self.total, self.count]


class ModelStats:
    """One label's per-request counters, looked up once per request; typed in metrics.pxd."""

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}  # by status, but 200: see request_counts
        self.ok_requests = 0  # status 200, nearly every request: a C counter, not a dict entry
        self.durations: dict[int, Histogram] = {}  # by status class: 2 for 2xx...
        self.ok_durations: Histogram | None = None
        self.first_token = Histogram(FIRST_TOKEN_BUCKETS)

    def request_counts(self) -> dict[int, int]:
        """Requests by status."""
        counts = dict(self.requests)
        if self.ok_requests:
            counts[200] = self.ok_requests
        return counts

    def finished(self, status: int, seconds: float | None) -> None:
        """A request ended; `seconds` it took when a replica answered it, else None (the
        router's own refusals do not belong in the duration histogram)."""
        if status == 200:
            self.ok_requests += 1
        else:
            self.requests[status] = self.requests.get(status, 0) + 1
        if seconds is None:
            return
        histogram = self.ok_durations  # durations[2], once it exists: no lookup for a 2xx
        if histogram is None or status // 100 != 2:
            klass = status // 100
            histogram = self.durations.get(klass)
            if histogram is None:
                histogram = self.durations[klass] = Histogram(DURATION_BUCKETS)
            if klass == 2:
                self.ok_durations = histogram
        histogram.observe(seconds)


class RouterMetrics:
    """Counters of one router process; `state()` is what workers share with each other.
    Typed in metrics.pxd."""

    def __init__(self) -> None:
        self.models: dict[str, ModelStats] = {}
        self.upstream_errors: dict[tuple[str, str], int] = {}
        self.ejections: dict[tuple[str, str], int] = {}
        self.parked: dict[str, int] = {}  # model -> requests waiting for a replica now
        self.wakes: dict[str, Histogram] = {}  # model -> time its requests waited
        self.retries = 0
        self.in_flight = 0

    def model(self, label: str) -> ModelStats:
        stats = self.models.get(label)
        if stats is None:
            stats = self.models[label] = ModelStats()
        return stats

    def upstream_error(self, model: str, kind: str) -> None:
        key = (model, kind)
        self.upstream_errors[key] = self.upstream_errors.get(key, 0) + 1

    def ejected(self, model: str, replica: str) -> None:
        key = (model, replica)
        self.ejections[key] = self.ejections.get(key, 0) + 1

    def woke(self, model: str, seconds: float) -> None:
        histogram = self.wakes.get(model)
        if histogram is None:
            histogram = self.wakes[model] = Histogram(WAKE_BUCKETS)
        histogram.observe(seconds)

    def state(self) -> dict:
        models = self.models.items()
        return {
            "requests": [
                [m, status, n] for m, s in models for status, n in s.request_counts().items()
            ],
            "durations": [
                [m, f"{klass}xx", h.values()] for m, s in models for klass, h in s.durations.items()
            ],
            "first_token": [[m, s.first_token.values()] for m, s in models if s.first_token.count],
            "upstream_errors": [[*k, v] for k, v in self.upstream_errors.items()],
            "ejections": [[*k, v] for k, v in self.ejections.items()],
            "parked": [[k, v] for k, v in self.parked.items()],
            "wakes": [[k, h.values()] for k, h in self.wakes.items()],
            "retries": self.retries,
            "in_flight": self.in_flight,
        }


def merge(states: list[dict]) -> dict:
    """The sum of several workers' states, in the same shape."""
    total = {
        name: {}
        for name in (
            "requests",
            "durations",
            "first_token",
            "upstream_errors",
            "ejections",
            "parked",
            "wakes",
        )
    }
    total["retries"] = total["in_flight"] = 0
    for state in states:
        for name in ("requests", "upstream_errors", "ejections", "parked"):
            for *key, value in state.get(name, []):
                total[name][tuple(key)] = total[name].get(tuple(key), 0) + value
        for name in ("durations", "first_token", "wakes"):
            for *key, values in state.get(name, []):
                key = tuple(key) if len(key) > 1 else key[0]
                current = total[name].get(key)
                total[name][key] = (
                    values
                    if current is None
                    else [a + b for a, b in zip(current, values, strict=True)]
                )
        total["retries"] += state["retries"]
        total["in_flight"] += state["in_flight"]
    return total


class SharedMetrics:
    """Where the workers of one router leave their states; absent with a single worker."""

    def __init__(self, folder: str, worker: int) -> None:
        self.folder = Path(folder)
        self.path = self.folder / f"worker-{worker}.json"

    def publish(self, state: dict) -> None:
        """This worker's counters (once a tick, and at each scrape it answers)."""
        staging = self.path.with_suffix(".tmp")
        staging.write_bytes(orjson.dumps(state))
        os.replace(staging, self.path)  # readers never see half a file

    def gather(self, state: dict) -> list[dict]:
        """Every worker's state, this one's as it is now: each file only grows, so their
        sum never goes back between scrapes, whichever worker answers."""
        self.publish(state)
        states = []
        for path in sorted(self.folder.glob("worker-*.json")):
            try:
                states.append(orjson.loads(path.read_bytes()))
            except (OSError, orjson.JSONDecodeError):
                continue  # a worker that is starting or gone
        return states


def labels(**values) -> str:
    return ",".join(f'{name}="{escape_label(str(value))}"' for name, value in values.items())


def family(name: str, kind: str, help_text: str, samples) -> list[str]:
    """One metric family: `samples` are (label string, value) pairs."""
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for label_text, value in samples:
        out.append(f"{name}{{{label_text}}} {value}" if label_text else f"{name} {value}")
    return out


def histogram_family(name: str, help_text: str, buckets: tuple, series) -> list[str]:
    """`series` are (label string, bucket counts + [sum, count]) pairs."""
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for label_text, values in series:
        cumulative = 0
        for bound, count in zip(buckets, values, strict=False):
            cumulative += int(count)
            out.append(f'{name}_bucket{{{label_text},le="{bound}"}} {cumulative}')
        out.append(f'{name}_bucket{{{label_text},le="+Inf"}} {int(values[-1])}')
        out.append(f"{name}_sum{{{label_text}}} {values[-2]}")
        out.append(f"{name}_count{{{label_text}}} {int(values[-1])}")
    return out


# (name, kind, help, key in the merged totals, label names) of the families kept per label set
KEYED_FAMILIES = (
    ("gpurouter_requests_total", "counter", "Requests answered, by model and status.",
     "requests", ("model", "status")),
    ("gpurouter_upstream_errors_total", "counter", "Upstream failures, by model and kind.",
     "upstream_errors", ("model", "kind")),
    ("gpurouter_ejections_total", "counter", "Replicas ejected after consecutive failures.",
     "ejections", ("model", "replica")),
    ("gpurouter_parked_requests", "gauge",
     "Requests waiting for a replica of their model (it is waking).", "parked", ("model",)),
)  # fmt: skip
HISTOGRAM_FAMILIES = (
    ("gpurouter_request_duration_seconds",
     "Time from request to the last byte, of requests a replica answered, by model and status"
     " class.", "durations", ("model", "code"), DURATION_BUCKETS),
    ("gpurouter_time_to_first_token_seconds",
     "Time from request to the first body chunk of the replica's answer.", "first_token",
     ("model",), FIRST_TOKEN_BUCKETS),
    ("gpurouter_wake_seconds", "Time from a model's first waiting request to its first replica.",
     "wakes", ("model",), WAKE_BUCKETS),
)  # fmt: skip


def label_set(names: tuple, key) -> str:
    values = key if isinstance(key, tuple) else (key,)
    return labels(**dict(zip(names, values, strict=True)))


def render(totals: dict, table, ejected_now: list[tuple[str, str]]) -> bytes:
    """Prometheus text of merged states; `ejected_now` are (model, replica) ejected now."""
    ejected = set(ejected_now)
    endpoints = [
        (m, replica) for m in sorted(served(table.models())) for _, replica, _ in table.endpoints(m)
    ]
    out = []
    for name, kind, help_text, key, names in KEYED_FAMILIES:
        samples = ((label_set(names, k), v) for k, v in sorted(totals[key].items()))
        out += family(name, kind, help_text, samples)
    for name, help_text, key, names, buckets in HISTOGRAM_FAMILIES:
        series = ((label_set(names, k), v) for k, v in sorted(totals[key].items()))
        out += histogram_family(name, help_text, buckets, series)
    out += family(
        "gpurouter_replica_ejected",
        "gauge",
        "Whether the replica is ejected now (1) or not (0).",
        (
            (labels(model=model, replica=replica), int((model, replica) in ejected))
            for model, replica in endpoints
        ),
    )
    out += family(
        "gpurouter_retries_total",
        "counter",
        "Requests sent again to another replica.",
        [("", totals["retries"])],
    )
    out += family(
        "gpurouter_in_flight_requests",
        "gauge",
        "Requests being answered now.",
        [("", totals["in_flight"])],
    )
    out += family(
        "gpurouter_endpoints", "gauge", "Endpoints in the routing table.", [("", len(endpoints))]
    )
    return ("\n".join(out) + "\n").encode()

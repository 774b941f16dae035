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
from bisect import bisect_left
from pathlib import Path

import orjson

# LLM latencies: a cached short answer in tens of ms, long generations in minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
OTHER_MODEL = "(unrouted)"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Histogram:
    __slots__ = ("buckets", "counts", "total", "count")

    def __init__(self, buckets: tuple) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def values(self) -> list[float]:
        return [*self.counts, self.total, self.count]


class ModelStats:
    """One label's per-request counters, looked up once per request."""

    __slots__ = ("requests", "durations", "first_token")

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}
        self.durations: dict[int, Histogram] = {}  # by status class: 2 for 2xx...
        self.first_token = Histogram(FIRST_TOKEN_BUCKETS)

    def finished(self, status: int) -> None:
        self.requests[status] = self.requests.get(status, 0) + 1

    def answered_by_replica(self, status: int, seconds: float) -> None:
        klass = status // 100
        histogram = self.durations.get(klass)
        if histogram is None:
            histogram = self.durations[klass] = Histogram(DURATION_BUCKETS)
        histogram.observe(seconds)


class RouterMetrics:
    """Counters of one router process; `state()` is what workers share with each other."""

    def __init__(self) -> None:
        self.models: dict[str, ModelStats] = {}
        self.upstream_errors: dict[tuple[str, str], int] = {}
        self.ejections: dict[tuple[str, str], int] = {}
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

    def state(self) -> dict:
        models = self.models.items()
        return {
            "requests": [[m, status, n] for m, s in models for status, n in s.requests.items()],
            "durations": [
                [m, f"{klass}xx", h.values()] for m, s in models for klass, h in s.durations.items()
            ],
            "first_token": [[m, s.first_token.values()] for m, s in models if s.first_token.count],
            "upstream_errors": [[*k, v] for k, v in self.upstream_errors.items()],
            "ejections": [[*k, v] for k, v in self.ejections.items()],
            "retries": self.retries,
            "in_flight": self.in_flight,
        }


def merge(states: list[dict]) -> dict:
    """The sum of several workers' states, in the same shape."""
    total = {name: {} for name in ("requests", "durations", "first_token", "upstream_errors")}
    total["ejections"] = {}
    total["retries"] = total["in_flight"] = 0
    for state in states:
        for name in ("requests", "upstream_errors", "ejections"):
            for *key, value in state[name]:
                total[name][tuple(key)] = total[name].get(tuple(key), 0) + value
        for name in ("durations", "first_token"):
            for *key, values in state[name]:
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

    def publish(self, metrics: RouterMetrics) -> None:
        staging = self.path.with_suffix(".tmp")
        staging.write_bytes(orjson.dumps(metrics.state()))
        os.replace(staging, self.path)  # readers never see half a file

    def gather(self, metrics: RouterMetrics) -> dict:
        self.publish(metrics)
        states = []
        for path in sorted(self.folder.glob("worker-*.json")):
            try:
                states.append(orjson.loads(path.read_bytes()))
            except (OSError, orjson.JSONDecodeError):
                continue  # a worker that is starting or gone
        return merge(states)


def render(totals: dict, table, ejected_now: list[tuple[str, str]]) -> bytes:
    """Prometheus text of merged states; `ejected_now` are (model, replica) ejected now."""
    out = [
        "# HELP gpurouter_requests_total Requests answered, by model and status.",
        "# TYPE gpurouter_requests_total counter",
    ]
    for (model, status), count in sorted(totals["requests"].items()):
        out.append(
            f'gpurouter_requests_total{{model="{escape_label(model)}",status="{status}"}} {count}'
        )
    out += [
        "# HELP gpurouter_request_duration_seconds Time from request to the last byte, of"
        " requests a replica answered, by model and status class.",
        "# TYPE gpurouter_request_duration_seconds histogram",
    ]
    for (model, klass), values in sorted(totals["durations"].items()):
        labels = f'model="{escape_label(model)}",code="{klass}"'
        out += render_histogram(
            "gpurouter_request_duration_seconds", labels, DURATION_BUCKETS, values
        )
    out += [
        "# HELP gpurouter_time_to_first_token_seconds Time from request to the first body chunk"
        " of the replica's answer.",
        "# TYPE gpurouter_time_to_first_token_seconds histogram",
    ]
    for model, values in sorted(totals["first_token"].items()):
        labels = f'model="{escape_label(model)}"'
        out += render_histogram(
            "gpurouter_time_to_first_token_seconds", labels, FIRST_TOKEN_BUCKETS, values
        )
    out += [
        "# HELP gpurouter_upstream_errors_total Upstream failures, by model and kind.",
        "# TYPE gpurouter_upstream_errors_total counter",
    ]
    for (model, kind), count in sorted(totals["upstream_errors"].items()):
        out.append(
            f'gpurouter_upstream_errors_total{{model="{escape_label(model)}",kind="{kind}"}}'
            f" {count}"
        )
    out += [
        "# HELP gpurouter_ejections_total Replicas ejected after consecutive failures.",
        "# TYPE gpurouter_ejections_total counter",
    ]
    for (model, replica), count in sorted(totals["ejections"].items()):
        out.append(
            f'gpurouter_ejections_total{{model="{escape_label(model)}",'
            f'replica="{escape_label(replica)}"}} {count}'
        )
    out += [
        "# HELP gpurouter_replica_ejected Whether the replica is ejected now (1) or not (0).",
        "# TYPE gpurouter_replica_ejected gauge",
    ]
    ejected = set(ejected_now)
    for model in sorted(table.models()):
        for _, replica, _ in table.endpoints(model):
            flag = 1 if (model, replica) in ejected else 0
            out.append(
                f'gpurouter_replica_ejected{{model="{escape_label(model)}",'
                f'replica="{escape_label(replica)}"}} {flag}'
            )
    endpoints = sum(len(table.endpoints(m)) for m in table.models())
    out += [
        "# HELP gpurouter_retries_total Requests sent again to another replica.",
        "# TYPE gpurouter_retries_total counter",
        f"gpurouter_retries_total {totals['retries']}",
        "# HELP gpurouter_in_flight_requests Requests being answered now.",
        "# TYPE gpurouter_in_flight_requests gauge",
        f"gpurouter_in_flight_requests {totals['in_flight']}",
        "# HELP gpurouter_endpoints Endpoints in the routing table.",
        "# TYPE gpurouter_endpoints gauge",
        f"gpurouter_endpoints {endpoints}",
    ]
    return ("\n".join(out) + "\n").encode()


def render_histogram(name: str, labels: str, buckets: tuple, values: list[float]) -> list[str]:
    lines = []
    cumulative = 0
    for bound, count in zip(buckets, values, strict=False):
        cumulative += int(count)
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {int(values[-1])}')
    lines.append(f"{name}_sum{{{labels}}} {values[-2]}")
    lines.append(f"{name}_count{{{labels}}} {int(values[-1])}")
    return lines

"""Prometheus text metrics of the router, kept in plain dicts and rendered on scrape."""

from bisect import bisect_left

# LLM latencies: a cached short answer in tens of ms, long generations in minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
FIRST_BYTE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Histogram:
    __slots__ = ("buckets", "counts", "total", "count")

    def __init__(self, buckets) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def render(self, name: str, labels: str) -> list[str]:
        lines = []
        cumulative = 0
        sep = "," if labels else ""
        for bound, count in zip(self.buckets, self.counts, strict=False):
            cumulative += count
            lines.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines


class RouterMetrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.durations: dict[str, Histogram] = {}
        self.first_byte: dict[str, Histogram] = {}
        self.upstream_errors: dict[tuple[str, str], int] = {}
        self.retries = 0
        self.in_flight = 0

    def finished(self, model: str, status: int, duration: float) -> None:
        key = (model, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        histogram = self.durations.get(model)
        if histogram is None:
            histogram = self.durations[model] = Histogram(DURATION_BUCKETS)
        histogram.observe(duration)

    def first_byte_after(self, model: str, seconds: float) -> None:
        histogram = self.first_byte.get(model)
        if histogram is None:
            histogram = self.first_byte[model] = Histogram(FIRST_BYTE_BUCKETS)
        histogram.observe(seconds)

    def upstream_error(self, model: str, kind: str) -> None:
        key = (model, kind)
        self.upstream_errors[key] = self.upstream_errors.get(key, 0) + 1

    def render(self, ejections_total: int, endpoints: int) -> bytes:
        out = [
            "# HELP gpurouter_requests_total Requests answered, by model and status.",
            "# TYPE gpurouter_requests_total counter",
        ]
        for (model, status), count in sorted(self.requests.items()):
            out.append(f'gpurouter_requests_total{{model="{model}",status="{status}"}} {count}')
        out += [
            "# HELP gpurouter_request_duration_seconds Time from request to the last byte.",
            "# TYPE gpurouter_request_duration_seconds histogram",
        ]
        for model, histogram in sorted(self.durations.items()):
            out += histogram.render("gpurouter_request_duration_seconds", f'model="{model}"')
        out += [
            "# HELP gpurouter_time_to_first_byte_seconds Time from request to the first byte"
            " of the upstream answer.",
            "# TYPE gpurouter_time_to_first_byte_seconds histogram",
        ]
        for model, histogram in sorted(self.first_byte.items()):
            out += histogram.render("gpurouter_time_to_first_byte_seconds", f'model="{model}"')
        out += [
            "# HELP gpurouter_upstream_errors_total Upstream failures, by model and kind.",
            "# TYPE gpurouter_upstream_errors_total counter",
        ]
        for (model, kind), count in sorted(self.upstream_errors.items()):
            out.append(f'gpurouter_upstream_errors_total{{model="{model}",kind="{kind}"}} {count}')
        out += [
            "# HELP gpurouter_retries_total Requests sent again to another replica.",
            "# TYPE gpurouter_retries_total counter",
            f"gpurouter_retries_total {self.retries}",
            "# HELP gpurouter_ejections_total Replicas ejected after consecutive failures.",
            "# TYPE gpurouter_ejections_total counter",
            f"gpurouter_ejections_total {ejections_total}",
            "# HELP gpurouter_in_flight_requests Requests being answered now.",
            "# TYPE gpurouter_in_flight_requests gauge",
            f"gpurouter_in_flight_requests {self.in_flight}",
            "# HELP gpurouter_endpoints Endpoints in the routing table.",
            "# TYPE gpurouter_endpoints gauge",
            f"gpurouter_endpoints {endpoints}",
        ]
        return ("\n".join(out) + "\n").encode()

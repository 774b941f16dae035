"""The per-request counters as scraped: every status and duration class a model saw, summed
across workers."""

from router.path.fastpath import EndpointTable
from router.telemetry.metrics import RouterMetrics, merge, render


def test_requests_by_status_count_the_common_200_and_the_rest_alike():
    metrics = RouterMetrics()
    stats = metrics.model("m")
    for status in (200, 200, 404, 200, 503, 201):
        stats.finished(status, 0.02)
    stats.finished(429, None)  # refused by the router: no duration
    assert stats.request_counts() == {200: 3, 404: 1, 503: 1, 201: 1, 429: 1}
    assert stats.durations[2].count == 4 and stats.durations[4].count == 1
    assert 3 not in stats.durations and stats.durations[5].count == 1

    state = metrics.state()
    assert sorted(map(tuple, state["requests"])) == [
        ("m", 200, 3),
        ("m", 201, 1),
        ("m", 404, 1),
        ("m", 429, 1),
        ("m", 503, 1),
    ]
    text = render(merge([state, state]), EndpointTable(), []).decode()
    assert 'gpurouter_requests_total{model="m",status="200"} 6' in text
    assert 'gpurouter_requests_total{model="m",status="404"} 2' in text
    assert 'gpurouter_request_duration_seconds_count{model="m",code="2xx"} 8' in text

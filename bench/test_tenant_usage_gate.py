"""Usage at the control plane equals the routers' own counters within 1%, across a leader
kill -9 and a router paused 35 s (bench/tenant_usage.py, one run)."""

import pytest

from bench.figures import record
from bench.tenant_usage import measure


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    found = measure(tmp_path_factory.mktemp("usage"), pause_s=35.0)
    ratio = found["ratio"]
    record(
        f"tenant usage across a leader kill -9 and a 35 s router pause: {found['sent']} requests;"
        f" usage / routers' counters: requests {ratio['requests']}, prompt tokens"
        f" {ratio['prompt_tokens']}, completion tokens {ratio['completion_tokens']}"
    )
    return found


def test_usage_equals_the_routers_counters_across_a_failover_and_a_pause(result):
    assert result["statuses"] == [200], result
    for field, ratio in result["ratio"].items():
        assert ratio is not None and abs(ratio - 1.0) <= 0.01, (field, result)

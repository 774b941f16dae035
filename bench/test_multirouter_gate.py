"""Several routers routing on what the engines report, gated on the goal as written, on three short
traces pooled (bench/multirouter.py): three routers in front of eight queueing sim engines, the same
bursty trace for (a) each router's own counts and (b) engine-reported load, both at the
router's defaults otherwise.

- nothing lost under either (the first test);
- (b)'s p99 time to first token at least 30% under (a)'s: p99(b) <= 0.7 x p99(a) (the second:
  not reached on these traces, so expected to fail, strictly: the day it passes, it fails as
  unexpectedly passing and moves to the first).

The full table, with prefix affinity and one router alone, is `python -m bench.multirouter`.
"""

import pytest

from bench.figures import record
from bench.multirouter import compare

SECONDS = 20.0
SEEDS = [1, 2, 3]  # pooled: the p99 of one 20 s trace rests on its 4 slowest requests


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    from tests.harness import Processes

    procs = Processes(tmp_path_factory.mktemp("multirouter"))
    try:
        found = {row["policy"]: row for row in compare(procs, SECONDS, ["a", "b"], SEEDS)}
    finally:
        procs.stop_all()
    a, b = found["a"], found["b"]
    record(
        f"multirouter (3 routers, 8 engines, 3 bursty traces of {SECONDS:g} s): p99 TTFT own counts"
        f" {a['ttft_p99_ms']:.0f} ms, engine-reported {b['ttft_p99_ms']:.0f} ms"
        f" ({b['ttft_p99_ms'] / a['ttft_p99_ms']:.2f}x); mean {a['ttft_mean_ms']:.0f} /"
        f" {b['ttft_mean_ms']:.0f} ms; queue spread {a['queue_spread']} / {b['queue_spread']}"
    )
    return found


def test_routing_on_engine_reported_load_loses_nothing(rows):
    a, b = rows["a"], rows["b"]
    assert a["lost"] == 0 and b["lost"] == 0, rows
    assert a["requests"] == b["requests"] > 1000, "the same trace for both"


@pytest.mark.xfail(
    strict=True,
    reason="measured 0.92x to 1.51x on these pooled traces (goal 0.7x): their tail is bursts"
    " over the engines' capacity, where every request waits for a place whichever replica it"
    " chose; the 60 s trace of bench.multirouter reaches 0.33x",
)
def test_engine_reported_load_cuts_the_p99_ttft_of_three_routers_by_30_percent(rows):
    a, b = rows["a"], rows["b"]
    assert b["ttft_p99_ms"] <= 0.7 * a["ttft_p99_ms"], rows

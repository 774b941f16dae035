"""Several routers routing on what the engines report, gated on the goal as written, on three short
traces pooled (bench/multirouter.py): three routers in front of eight queueing sim engines, the same
bursty trace for (a) each router's own counts, affinity off, and (c) what a user gets by
default: engine-reported load with prefix affinity.

- nothing lost under either (the first test);
- (c)'s p99 time to first token at least 30% under (a)'s: p99(c) <= 0.7 x p99(a) (the second:
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
        found = {row["policy"]: row for row in compare(procs, SECONDS, ["a", "c"], SEEDS)}
    finally:
        procs.stop_all()
    a, c = found["a"], found["c"]
    record(
        f"multirouter (3 routers, 8 engines, 3 bursty traces of {SECONDS:g} s): p99 TTFT own counts"
        f" {a['ttft_p99_ms']:.0f} ms, the defaults (engine-reported load, prefix affinity)"
        f" {c['ttft_p99_ms']:.0f} ms ({c['ttft_p99_ms'] / a['ttft_p99_ms']:.2f}x); mean"
        f" {a['ttft_mean_ms']:.0f} / {c['ttft_mean_ms']:.0f} ms; queue spread"
        f" {a['queue_spread']} / {c['queue_spread']}; prefix hits {a['prefix_hit_rate']} /"
        f" {c['prefix_hit_rate']}"
    )
    return found


def test_routing_on_engine_reported_load_loses_nothing(rows):
    a, c = rows["a"], rows["c"]
    assert a["lost"] == 0 and c["lost"] == 0, rows
    assert a["requests"] == c["requests"] > 1000, "the same trace for both"


@pytest.mark.xfail(
    strict=True,
    reason="the defaults measured 1.00x and 1.12x own counts on these pooled traces (3,897"
    " against 3,915 ms; 3,886 against 3,460; goal 0.7x): their tail is bursts over the"
    " engines' capacity, where every request"
    " waits for a place whichever replica it chose, and every prompt root is unique, so"
    " prefix affinity buys no hit (0.354 both ways) and can only spread within its bound",
)
def test_the_defaults_cut_the_p99_ttft_of_three_routers_by_30_percent(rows):
    a, c = rows["a"], rows["c"]
    assert c["ttft_p99_ms"] <= 0.7 * a["ttft_p99_ms"], rows

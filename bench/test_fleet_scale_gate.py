"""Operators' reads at fleet scale, with real processes and tokens on (bench/fleet_scale.py):
`gpuctl status` back to back never costs a heartbeat, and grows no faster than the fleet; nor
does registering the fleet, each node then heartbeating with its own credential (a lookup of
every node's credential per call made it grow with the square of the fleet).

CI runs 2,000 and 4,000 nodes; GPUFLEET_BENCH_NODES=16000 runs the full size beside 2,000
(several minutes). The absolute goals are reported, not gated: status under 500 ms, the first
page of `gpuctl nodes` under 200 ms.
"""

import os

import pytest

from bench.figures import record
from bench.fleet_scale import growth, measure

pytestmark = pytest.mark.integration
SMALL = 2000
LARGE = int(os.environ.get("GPUFLEET_BENCH_NODES", "4000"))
STOP_DEADLINE_S = 5.0  # the server's 3 s drain deadline, and its state closed


def test_status_at_fleet_scale_loses_no_heartbeat_and_grows_at_most_linearly(benchmark):
    small = measure(SMALL)
    large = benchmark.pedantic(measure, args=(LARGE,), rounds=1, iterations=1)
    ratio = growth(small, large)
    registering = (large.register_s / small.register_s) / (large.nodes / small.nodes)
    benchmark.extra_info.update({"small": small.__dict__, "large": large.__dict__})
    record("fleet scale: " + small.line())
    record("fleet scale: " + large.line())
    record(f"fleet scale: status growth against linear {ratio:.2f} (gate 1.0)")
    record(f"fleet scale: registration growth against linear {registering:.2f} (gate 1.5)")
    for figures in (small, large):
        assert figures.heartbeats_lost == 0, figures.line()
        assert figures.not_ready == 0, figures.line()
        assert figures.stop_s <= STOP_DEADLINE_S, figures.line()
    assert ratio <= 1.0
    assert registering <= 1.5

"""What traces cost the router: gpurouter with `--otlp-endpoint` at 1% sampling against the
same router without, both at once on one CPU with the load taking turns (bench/compare_routers.py
--traces --paired); gated on the median of eleven rounds of fresh processes, each of forty
turns (>= 0.97x).

Not reached, and held as a strict expected failure with its bound: on this 2-core machine the
median measured 0.959, 0.965 and 0.967 (eleven rounds each; seven-round runs 0.965 and 0.969),
where the same router with traces on and nothing sampled (`--trace-sample 0`) measured 0.990
and 0.995. A sampled request's span costs about 8 us in all when it runs warm (2.5 on the
request path, 5.8 to encode on the export thread), which at 1% would be 0.4% of a request's
CPU; measured, the 1% costs three times what 100% (0.53x) costs per span. Neither the export
(posting to a closed port: 0.963), nor the header to the engine (0.98 without it, within the
noise), nor compiling router/tracing.py (0.967) moved it. What is left, not established, is
what a rare span costs when its code and data are cold in the caches.

The figures are from the machine's Python 3.11.7 (the default PATH, as `make test` finds it).
Under Debian's Python 3.11.2 the same gate measured 0.982, twice: there it passes its bound,
and this expected failure fails the run as XPASS.
"""

import pytest

from bench.figures import record
from bench.paired_gate import run_paired


@pytest.mark.xfail(
    strict=True,
    reason="not reached: traces at 1% measured a median 0.959-0.967x the router without"
    " (goal 0.97x), against 0.990-0.995x with traces on and nothing sampled; a span costs"
    " about 8 us warm, yet at 1% each costs three times its share at 100% (0.53x); on"
    " Debian's Python 3.11.2 it measured 0.982",
)
def test_traces_at_one_percent_cost_at_most_three_percent_per_core(benchmark):
    found = run_paired("--traces", 11, benchmark, slices=40)
    benchmark.extra_info["traces_over_plain_per_core"] = found.median
    record(
        f"traces at 1% sampling, rate per core: median round {found.median}x the same router"
        f" without (goal 0.97; pooled {found.pooled}; rounds {found.rounds})"
    )
    assert found.passed, found.output

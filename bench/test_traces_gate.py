"""What traces cost the router: gpurouter with `--otlp-endpoint` at 1% sampling against the
same router without, both at once on one CPU with the load taking turns (bench/compare_routers.py
--traces --paired); gated on the mean of the middle half of thirty-one rounds of fresh processes,
each of forty turns in 5 s (>= 0.97x). Fifteen rounds read 0.968 and 0.988 of the same code on
one machine an hour apart: too few for a cost of 1-2% against a bound of 3%. Not shorter
rounds, as the tenant gate has: spans are posted 5 s after the first waits (or 512 at a time),
and a round of 3 s held no post at all (0.994).

What it took (router/telemetry/tracing.py): an unsampled request looks at the `traceparent` its
reader kept by name, where a search of its header lines had cost 1-1.5% by itself; a sampled one
records its events as tuples; the event loop writes them as OTLP/JSON from templates, a few
spans at a time, on a connection it keeps. From a thread of their own the spans had cost 3.4%
(the GIL changed hands at every callback's edge while it encoded; the median measured
0.959-0.976); on the loop, 0.983 (pooled 0.985), and 0.994 with no post in the rounds at all.
"""

from bench.figures import record
from bench.paired_gate import run_paired


def test_traces_at_one_percent_cost_at_most_three_percent_per_core(benchmark):
    found = run_paired("--traces", 31, benchmark, slices=40)
    benchmark.extra_info["traces_over_plain_per_core"] = found.central
    record(
        f"traces at 1% sampling, rate per core: {found.central}x the same router without, the"
        f" mean of the middle half of the rounds (goal 0.97; median {found.median}; pooled"
        f" {found.pooled}; rounds {found.rounds})"
    )
    assert found.passed, found.output

"""What traces cost the router: gpurouter with `--otlp-endpoint` at 1% sampling against the
same router without, both at once on one CPU with the load taking turns (bench/compare_routers.py
--traces --paired); gated on the median of seven rounds of fresh processes (>= 0.97x): a
round's figure swings with how many of the exporter's batches landed in it."""

from bench.figures import record
from bench.paired_gate import run_paired


def test_traces_at_one_percent_cost_at_most_three_percent_per_core(benchmark):
    found = run_paired("--traces", 7, benchmark)
    benchmark.extra_info["traces_over_plain_per_core"] = found.median
    record(
        f"traces at 1% sampling, rate per core: median round {found.median}x the same router"
        f" without (goal 0.97; pooled {found.pooled}; rounds {found.rounds})"
    )
    assert found.passed, found.output

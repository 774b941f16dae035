"""What traces cost the router: gpurouter with `--otlp-endpoint` at 1% sampling against the
same router without, both at once on one CPU with the load taking turns (bench/compare_routers.py
--traces --paired); gated on the median of seven rounds of fresh processes (>= 0.97x): a
round's figure swings with how many of the exporter's batches landed in it."""

import re
import subprocess
import sys
from pathlib import Path

from bench.figures import record

ROOT = Path(__file__).resolve().parents[1]


def test_traces_at_one_percent_cost_at_most_three_percent_per_core(benchmark):
    done = {}

    def run():
        done["run"] = subprocess.run(
            [sys.executable, "-m", "bench.compare_routers", "--traces", "--paired",
             "--rounds", "7", "--seconds", "5", "--slices", "20", "--gate"],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
        )  # fmt: skip

    benchmark.pedantic(run, rounds=1, iterations=1)
    out = done["run"].stdout
    found = re.search(r"per core: ([\d.]+) \(round by round: ([\d. ]+); median round ([\d.]+)", out)
    assert found, out + done["run"].stderr
    benchmark.extra_info["traces_over_plain_per_core"] = float(found.group(3))
    record(
        f"traces at 1% sampling, rate per core: median round {found.group(3)}x the same router"
        f" without (goal 0.97; pooled {found.group(1)}; rounds {found.group(2)})"
    )
    assert done["run"].returncode == 0, out + done["run"].stderr

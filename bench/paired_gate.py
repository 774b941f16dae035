"""One run of `bench.compare_routers --paired` for a gate: gpurouter with a feature against the
same router without, both on one CPU with the load taking turns, and what it printed."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = re.compile(
    r"per core: ([\d.]+) \(round by round: ([\d. ]+); median round ([\d.]+);"
    r" mean of the middle half ([\d.]+)\)"
)


@dataclass
class Paired:
    pooled: float  # the feature's rate per core over the plain router's, all rounds pooled
    rounds: str  # round by round, as printed
    median: float  # the median round
    central: float  # the mean of the middle half of the rounds: what is gated
    passed: bool  # what --gate said
    output: str


def run_paired(
    feature: str,
    rounds: int,
    benchmark,
    slices: int = 20,
    seconds: float = 5.0,
    warm: float = 0.0,
) -> Paired:
    """`feature`: --tenant, --traces or --nginx; `warm`: compare_routers' --warm. Run under
    pytest-benchmark's `benchmark`, once, or as it is where a module's tests share the run
    (`benchmark` None)."""
    done = {}

    def run():
        done["run"] = subprocess.run(
            [sys.executable, "-m", "bench.compare_routers", feature, "--paired",
             "--rounds", str(rounds), "--seconds", str(seconds), "--slices", str(slices),
             "--warm", str(warm), "--gate"],
            capture_output=True, text=True, cwd=ROOT, timeout=60 * rounds + 60 + warm,
        )  # fmt: skip

    if benchmark is None:
        run()
    else:
        benchmark.pedantic(run, rounds=1, iterations=1)
    output = done["run"].stdout + done["run"].stderr
    found = FIGURES.search(done["run"].stdout)
    if found is None:  # not a figure under the bar: the run itself failed
        raise RuntimeError(output)
    return Paired(
        float(found.group(1)), found.group(2), float(found.group(3)), float(found.group(4)),
        done["run"].returncode == 0, output,
    )  # fmt: skip

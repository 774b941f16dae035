"""Perf gate of the compiled request path: `bench.proxy_inprocess` on the compiled modules
against the same source interpreted. A change that sends the request path back to the
interpreter (an untyped attribute, a call that leaves C, a module dropped from the build)
shows here as a falling ratio.

The gate counts machine instructions (valgrind, `bench.instructions`), which the other
processes of a shared machine do not move: the earlier gate on paired timings read medians
from 6.9 to 12.2 on one machine as its load changed, one busy hour from failing on noise. The
timed ratio (`bench.compiled_gain`, CPU time of interleaved pairs) is still measured and
reported, and is the gate where valgrind is not installed."""

import json
import shutil
import subprocess
import sys

from bench.figures import record
from bench.instructions import compiled_and_interpreted
from bench.proxy_inprocess import run

# Interpreted / compiled instructions per request measured 7.19 (22.4k against 161.1k) with
# the hash seed fixed, the same to 0.01% run to run (other seeds moved it by up to 3%). The
# gate sits 10% under it: a module left interpreted costs far more than that, an untyped call
# on the path a few percent, which the figure shows.
MIN_INSTRUCTION_RATIO = 6.5
# Without valgrind: the median of 31 interleaved pairs on CPU time measured 7.4 on a machine
# whose other core was building llama.cpp; 9.8 to 12.2 (wall time) on a quiet one.
MIN_TIMED_RATIO = 6.0


def test_the_compiled_request_path_beats_its_interpreted_source(benchmark):
    done = subprocess.run(
        [sys.executable, "-m", "bench.compiled_gain", "--json", "--pairs", "31"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    timed = json.loads(done.stdout)
    benchmark.extra_info.update(timed)
    record(
        "request path µs/request (CPU time): interpreted={interpreted_us:.2f},"
        " compiled={compiled_us:.2f}, ratio={ratio:.2f} (pairs {lowest_pair:.2f} to"
        " {highest_pair:.2f})".format(**timed)
    )
    benchmark.pedantic(run, args=(2000,), rounds=5)  # the compiled path, as this process has it
    if shutil.which("valgrind") is None:
        record("request path instructions: valgrind not installed, gated on the timed ratio")
        assert timed["ratio"] >= MIN_TIMED_RATIO, timed
        return
    compiled, interpreted = compiled_and_interpreted()
    ratio = interpreted / compiled
    benchmark.extra_info.update(
        compiled_instructions=compiled, interpreted_instructions=interpreted, ratio=ratio
    )
    record(
        f"request path instructions/request: interpreted={interpreted:,.0f},"
        f" compiled={compiled:,.0f}, ratio={ratio:.2f}"
    )
    assert ratio >= MIN_INSTRUCTION_RATIO, (compiled, interpreted)

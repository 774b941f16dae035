import pytest

from bench.figures import FIGURES
from tests.conftest import procs  # noqa: F401  real processes, stopped when a gate ends


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("perf figures (same-run comparisons)")
        for line in FIGURES:
            terminalreporter.write_line(line)


def pytest_runtest_setup(item):
    """A gate's timings share the machine with nothing of the run's own: a build of
    llama-server still under way (tests/llama_cpp/background.py) ends first, and no other test
    runs beside it."""
    if hasattr(item.config, "workerinput"):
        pytest.fail("the perf gates run alone, never in pytest-xdist's workers: run without -n")
    background = getattr(item.config, "llama_background", None)
    if background is not None:
        background.wait()

from bench.figures import FIGURES
from tests.conftest import procs  # noqa: F401  real processes, stopped when a gate ends


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("perf figures (same-run comparisons)")
        for line in FIGURES:
            terminalreporter.write_line(line)

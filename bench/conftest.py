from bench.figures import FIGURES


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("perf figures (same-run comparisons)")
        for line in FIGURES:
            terminalreporter.write_line(line)

"""Figures the perf gates measured, printed together at the end of the test run."""

FIGURES: list[str] = []


def record(line: str) -> None:
    FIGURES.append(line)

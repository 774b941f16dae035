"""The paired gates' verdict (bench/compare_routers.py's report_rounds): the mean of the middle
half of the rounds, printed as bench/paired_gate.py reads it."""

from bench.compare_routers import report_rounds
from bench.paired_gate import FIGURES


def rounds_of(ratios: list[float]) -> list[list[dict]]:
    """One round a ratio: the plain router 1,000 answers a CPU second, the other `ratio` x."""
    return [
        [
            {"name": "plain", "answers": 1000, "cpu_ns": 10**9, "errors": 0},
            {"name": "feature", "answers": round(1000 * ratio), "cpu_ns": 10**9, "errors": 0},
        ]
        for ratio in ratios
    ]


def test_the_mean_of_the_middle_half_is_gated_and_printed(capsys):
    # Eight rounds: two at each end dropped, the middle four 0.96 0.97 0.98 0.99.
    ratios = [0.50, 0.90, 0.96, 0.97, 0.98, 0.99, 1.10, 1.50]
    assert report_rounds(rounds_of(ratios), ["plain", "feature"], True, 0.975, median=True) == 0
    printed = capsys.readouterr().out
    found = FIGURES.search(printed)
    assert found, printed
    assert float(found.group(3)) == 0.975  # the median
    assert float(found.group(4)) == 0.975  # the mean of the middle half
    assert "gate: 0.975 (at least 0.975), 0 errors ok" in printed
    assert report_rounds(rounds_of(ratios), ["plain", "feature"], True, 0.976, median=True) == 1


def test_one_round_far_off_moves_the_pool_but_not_the_verdict(capsys):
    ratios = [0.97] * 6 + [0.40]
    assert report_rounds(rounds_of(ratios), ["plain", "feature"], True, 0.95, median=True) == 0
    found = FIGURES.search(capsys.readouterr().out)
    assert float(found.group(1)) < 0.9  # pooled
    assert float(found.group(4)) == 0.97

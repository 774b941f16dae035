"""The premise of sleeping engines, gated on the goal as written, on a short trace at the real
processes' default timing (bench/multiplex.py, bench/fleetsim.py), worst of three seeds:

- sleep's SLO attainment >= 0.9 x dedicated's (a card per model) on a third of the cards;
- >= 1.2 x the better of pinned (the most popular models pinned) and cold-start room;
- refusals <= 1%, requests cut or sent where they could not be served: 0;
- p99 TTFT of swapped requests <= 1.5 x wake + one tick + one order delivery.

The first test holds the goals this build reaches; the second holds the goals it does not
reach yet, as they are written, and is expected to fail (strictly: once the build reaches
them it fails as unexpectedly passing, and moves to the first). The figures of both are
recorded for the release notes; the full table is `python -m bench.multiplex`.
"""

import pytest

from bench.figures import record
from bench.multiplex import Settings, percentile, verdict, worst_of

SHORT = Settings(models=12, cards=4, minutes=6, warmup_minutes=8, rate=0.3, cv=2.0)
SEEDS = (3, 4, 5)


@pytest.fixture(scope="module")
def worst():
    seed, results = worst_of(SHORT, SEEDS)
    record(f"multiplex ({SHORT.models} models on {SHORT.cards} cards, CV {SHORT.cv:g}, worst of"
           f" seeds {SEEDS}: {seed}): " + verdict(SHORT, results)  # fmt: skip
           + "; within the SLO: "
           + ", ".join(f"{p} {r.attainment:.0%}" for p, r in results.items()))  # fmt: skip
    return results


def test_sleep_cuts_nothing_refuses_little_and_swaps_by_waking(worst):
    for policy, result in worst.items():
        assert result.cut == 0, f"{policy}: {result.cut} requests cut by a stop, sleep or unload"
        assert result.failed == 0, f"{policy}: {result.failed} sent where they could not be served"
    sleep, cold, pinned = worst["sleep"], worst["cold"], worst["pinned"]
    assert sleep.refused_share <= 0.01, sleep.refused
    assert sleep.wakes > sleep.cold_starts, "swaps are wakes, not cold starts"
    assert sleep.attainment >= max(pinned.attainment, cold.attainment)
    assert percentile(sleep.swapped_ttft, 50) <= 0.25 * percentile(cold.swapped_ttft, 50)
    assert sleep.gpu_seconds_awake <= cold.gpu_seconds_awake


@pytest.mark.xfail(
    strict=True,
    reason="not reached yet (worst of 3 seeds): sleep 0.77x dedicated (goal 0.9), 1.12x the"
    " better of pinned and cold (goal 1.2), p99 swapped TTFT 19.5 s (goal 4.1 s). A sleeping"
    " engine wakes on its own card only, so a request for a model whose card holds another"
    " awake model waits for that one's in-flight requests and min_residency",
)
def test_sleep_reaches_the_goal_as_written(worst):
    sleep, dedicated = worst["sleep"], worst["dedicated"]
    best_other = max(worst["pinned"].attainment, worst["cold"].attainment)
    assert sleep.cards * 3 <= dedicated.cards
    assert sleep.attainment >= 0.9 * dedicated.attainment
    assert sleep.attainment >= 1.2 * best_other
    assert percentile(sleep.swapped_ttft, 99) <= SHORT.swap_bound_s

"""More models than cards, gated on the goals as written, on short traces at the real processes'
default timing (bench/multiplex.py, bench/fleetsim.py).

Sleeping engines (12 models on 4 cards, worst of three seeds):
- sleep's SLO attainment >= 0.9 x dedicated's (a card per model) on a third of the cards;
- >= 1.2 x the better of pinned (the most popular models pinned) and cold-start room;
- refusals <= 1%, requests cut or sent where they could not be served: 0;
- p99 TTFT of swapped requests <= 1.5 x wake + one tick + one order delivery.

Several engines awake on one card (`packed`: the real size mix, engines sharing a card's
compute; 24 models):
- >= 0.99 x dedicated's attainment on 8 cards, >= 0.95 x on 4 (six models a card);
- the cards packed needs for 0.99 x dedicated are at most half of what sleep needs;
- on the Aegaeon-shaped trace, >= 5 models a card at 0.99 x dedicated;
- nothing cut, misrouted or refused.

The first tests hold the goals this build reaches; the expected failures hold those it does
not reach yet, as written (strictly: once the build reaches one it fails as unexpectedly
passing, and moves up). The figures of all are recorded for the release notes; the full
tables are `python -m bench.multiplex` and `python -m bench.multiplex --cards-for 0.99`.
"""

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from bench.figures import record
from bench.multiplex import Settings, cards_needed, percentile, run, trace, verdict, worst_of

# Measured on bench/fleetsim.py's simulated clock: it may run beside other tests.
pytestmark = pytest.mark.virtual_clock

SHORT = Settings(models=12, cards=4, minutes=6, warmup_minutes=8, rate=0.3, cv=2.0)
SEEDS = (3, 4, 5)
DEFAULT = Settings(minutes=6, warmup_minutes=10, seed=3)  # 24 models, the size mix, 2 req/s
AEGAEON = replace(DEFAULT, trace="aegaeon")


@pytest.fixture(scope="module")
def worst():
    seed, results = worst_of(SHORT, SEEDS)
    record(f"multiplex ({SHORT.models} models on {SHORT.cards} cards, CV {SHORT.cv:g}, worst of"
           f" seeds {SEEDS}: {seed}): " + verdict(SHORT, results)  # fmt: skip
           + "; within the SLO: "
           + ", ".join(f"{p} {r.attainment:.0%}" for p, r in results.items()))  # fmt: skip
    return results


@pytest.fixture(scope="module")
def packing():
    """packed and dedicated: the default trace on 8 and 4 cards, the Aegaeon-shaped one on 4
    (six models a card); and the cards sleep and packed need on the short trace."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, s, cards in (("zipf-8", DEFAULT, 8), ("zipf-4", DEFAULT, 4),
                               ("aegaeon-4", AEGAEON, 4)):  # fmt: skip
            arrivals = trace(s)
            out[name] = run("packed", arrivals, s, Path(tmp), cards=cards)
            out[name + "-dedicated"] = run("dedicated", arrivals, s, Path(tmp))
        arrivals = trace(SHORT)
        bound = run("dedicated", arrivals, SHORT, Path(tmp)).attainment
        out["cards"] = {
            policy: cards_needed(policy, SHORT, arrivals, 0.99, Path(tmp), bound)
            for policy in ("sleep", "packed")
        }
    ratios = {name: out[name].attainment / max(out[name + "-dedicated"].attainment, 1e-9)
              for name in ("zipf-8", "zipf-4", "aegaeon-4")}  # fmt: skip
    out["ratios"] = ratios
    record(
        "packed (24 models, the size mix, shared compute): "
        + ", ".join(f"{name} {ratio:.2f}x dedicated" for name, ratio in ratios.items())
        + f"; cards for 0.99x dedicated on {SHORT.models} models: sleep"
        f" {out['cards']['sleep']}, packed {out['cards']['packed']}; p99 swapped TTFT"
        f" {percentile(out['zipf-8'].swapped_ttft, 99):.2f} s on 8 cards"
    )
    return out


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


def test_packed_cuts_nothing_and_serves_more_than_sleep_on_the_same_cards(worst, packing):
    for name in ("zipf-8", "zipf-4", "aegaeon-4"):
        result = packing[name]
        assert (result.cut, result.failed, result.refused) == (0, 0, 0), name
    assert worst["packed"].refused_share <= 0.01
    assert worst["packed"].attainment >= worst["sleep"].attainment
    assert packing["ratios"]["zipf-8"] >= 0.9


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


@pytest.mark.xfail(
    strict=True,
    reason="not reached yet: packed 0.92x dedicated on 8 cards (goal 0.99), 0.67x on 4 (goal"
    " 0.95); Aegaeon-shaped 0.82x on 4 cards (goal 0.99 at >= 5 models a card); p99 swapped"
    " TTFT 18.4 s on 8 cards (goal 4.1 s). Engines on"
    " one card share its compute (processor sharing, the pessimistic bound), and placement"
    " cannot know which models will be popular when it places them: a popular model keeps"
    " the card it was given and shares it with whatever wakes beside it",
)
def test_packed_reaches_dedicated_as_written(packing):
    ratios = packing["ratios"]
    assert ratios["zipf-8"] >= 0.99
    assert ratios["zipf-4"] >= 0.95
    assert ratios["aegaeon-4"] >= 0.99
    assert percentile(packing["zipf-8"].swapped_ttft, 99) <= DEFAULT.swap_bound_s


@pytest.mark.xfail(
    strict=True,
    reason="not reached yet: on the short trace (12 models) packed needs 6 cards for 0.99x"
    " dedicated, sleep 11 (goal: at most half, 5); the sixth card is the one a popular model"
    " gets to itself, since engines beside it would share its compute",
)
def test_packed_needs_at_most_half_the_cards_sleep_needs(packing):
    sleep, packed = packing["cards"]["sleep"], packing["cards"]["packed"]
    assert packed is not None, "packed never reaches 0.99x dedicated"
    assert sleep is None or packed * 2 <= sleep, (sleep, packed)

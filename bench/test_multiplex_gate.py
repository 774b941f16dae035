"""More models than cards, gated on the goals as written, on traces at the real processes'
default timing (bench/multiplex.py, bench/fleetsim.py), each run on a fresh store and the same
figures for a seed (bench.multiplex.run).

Sleeping engines (12 models on 4 cards, worst of three seeds), each goal a test:
- sleep's SLO attainment >= 0.9 x dedicated's (a card per model asked for) on a third of its
  cards; >= 1.2 x the better of pinned (the most popular pinned) and cold-start room;
- refusals <= 1%, requests cut or sent where they could not be served: 0;
- p99 TTFT of requests that found their model asleep <= 1.5 x wake + one tick + one order.

Several engines awake on one card (`packed`: the real size mix, speeds and wakes by size,
engines sharing a card's compute; 24 models, 30-minute traces with scale to zero on):
- Aegaeon-shaped trace: >= 6 models a card (the models the trace asks for over the cards) at
  >= 0.99 x dedicated;
- Zipf trace: >= 0.99 x dedicated on 8 cards; >= 0.95 x on 4;
- packed needs at most half the cards sleep needs for 0.99 x dedicated, on each trace;
- nothing cut, misrouted or refused under any policy, dedicated included.

The goals this build reaches are gates; each one it does not reach is a strict expected
failure of its own, its bound as written (once reached, it fails as unexpectedly passing and
moves up). Every figure is recorded for the release notes; the full tables are `python -m
bench.multiplex` and `python -m bench.multiplex --cards-for 0.99`.
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
# 24 models, the size mix, 2 requests a second; long enough for scale to zero (10 min) to act.
LONG = Settings(minutes=30, warmup_minutes=10, seed=3)
AEGAEON = replace(LONG, trace="aegaeon")
AEGAEON_CARDS = 3


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
    """packed and dedicated: the Zipf trace on 8 and 4 cards, the Aegaeon-shaped one on 3;
    and the cards sleep and packed need on the short traces."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, s, cards in (("zipf-8", LONG, 8), ("zipf-4", LONG, 4),
                               ("aegaeon", AEGAEON, AEGAEON_CARDS)):  # fmt: skip
            arrivals = trace(s)
            out[name] = run("packed", arrivals, s, Path(tmp), cards=cards)
            out[name + "-dedicated"] = run("dedicated", arrivals, s, Path(tmp))
        out["cards"] = {}
        for trace_name in ("zipf", "aegaeon"):
            short = replace(SHORT, trace=trace_name)
            arrivals = trace(short)
            bound = run("dedicated", arrivals, short, Path(tmp)).attainment
            out["cards"][trace_name] = {
                policy: cards_needed(policy, short, arrivals, 0.99, Path(tmp), bound)
                for policy in ("sleep", "packed")
            }
    ratios = {name: out[name].attainment / max(out[name + "-dedicated"].attainment, 1e-9)
              for name in ("zipf-8", "zipf-4", "aegaeon")}  # fmt: skip
    out["ratios"] = ratios
    aegaeon = out["aegaeon"]
    out["models_a_card"] = aegaeon.models / aegaeon.cards
    record(
        "packed (24 models, the size mix, shared compute, 30 min): "
        + ", ".join(f"{name} {ratio:.3f}x dedicated" for name, ratio in ratios.items())
        + f"; Aegaeon-shaped: {aegaeon.models} models asked on {aegaeon.cards} cards"
        f" ({out['models_a_card']:.1f} a card); cards for 0.99x dedicated on"
        f" {SHORT.models} models: "
        + "; ".join(f"{t}: sleep {c['sleep']}, packed {c['packed']}"
                    for t, c in out["cards"].items())  # fmt: skip
        + f"; p99 TTFT on 8 cards: woken {percentile(out['zipf-8'].swapped_ttft, 99):.2f} s,"
        f" cold {percentile(out['zipf-8'].cold_ttft, 99):.2f} s"
    )
    return out


def test_no_request_is_cut_misrouted_or_refused_under_any_policy(worst, packing):
    for policy, result in worst.items():
        assert result.cut == 0, f"{policy}: {result.cut} requests cut by a stop, sleep or unload"
        assert result.failed == 0, f"{policy}: {result.failed} sent where they could not be served"
    assert worst["dedicated"].refused == 0, "dedicated places every model its trace asks for"
    for name in ("zipf-8", "zipf-4", "aegaeon"):
        for result in (packing[name], packing[name + "-dedicated"]):
            assert (result.cut, result.failed, result.refused) == (0, 0, 0), (name, result.policy)


def test_sleep_refuses_little_and_swaps_by_waking(worst):
    sleep, cold, pinned = worst["sleep"], worst["cold"], worst["pinned"]
    assert sleep.refused_share <= 0.01, sleep.refused
    assert sleep.wakes > sleep.cold_starts, "swaps are wakes, not cold starts"
    assert sleep.attainment >= max(pinned.attainment, cold.attainment)
    assert sleep.gpu_seconds_awake <= cold.gpu_seconds_awake


def test_packed_serves_more_than_sleep_on_the_same_cards(worst, packing):
    assert worst["packed"].refused_share <= 0.01
    assert worst["packed"].attainment >= worst["sleep"].attainment


def test_packed_holds_six_models_a_card_at_dedicated_on_the_aegaeon_shaped_trace(packing):
    assert packing["models_a_card"] >= 6
    assert packing["ratios"]["aegaeon"] >= 0.99


@pytest.mark.xfail(
    strict=True,
    reason="not reached: sleep 0.67x dedicated on 4 of its 12 cards (worst of seeds 3-5; goal "
    "0.9). One awake engine a card (the default 0.9 share): every swap waits for the card's"
    " engine to sleep, then its own wake. Wakes scale with a model's weights (a 32B's is 4x"
    " an 8B's: 8 s at the default 2 s), past the 5 s SLO for the 14B and 32B models.",
)
def test_sleep_reaches_dedicated_on_a_third_of_its_cards(worst):
    sleep, dedicated = worst["sleep"], worst["dedicated"]
    assert sleep.cards * 3 <= dedicated.cards
    assert sleep.attainment >= 0.9 * dedicated.attainment


@pytest.mark.xfail(
    strict=True,
    reason="not reached: sleep 1.03x the better of pinned (65%) and cold (13%) (goal 1.2): pinned "
    "serves its most popular models at once, and sleep's swaps of the 14B and 32B models "
    "miss the SLO. Wakes scale with a model's weights (a 32B's is 4x an 8B's: 8 s at the "
    "default 2 s), past the 5 s SLO for the 14B and 32B models.",
)
def test_sleep_serves_a_fifth_more_than_pinned_or_cold(worst):
    best_other = max(worst["pinned"].attainment, worst["cold"].attainment)
    assert worst["sleep"].attainment >= 1.2 * best_other


@pytest.mark.xfail(
    strict=True,
    reason="not reached: p99 TTFT of requests that found their model asleep 92.4 s (goal 4.1 s): a"
    " wake waits for the card's awake engine to drain, sleep, and give its memory back. "
    "Wakes scale with a model's weights (a 32B's is 4x an 8B's: 8 s at the default 2 s), "
    "past the 5 s SLO for the 14B and 32B models.",
)
def test_a_woken_requests_p99_is_a_wake_and_a_tick(worst):
    assert percentile(worst["sleep"].swapped_ttft, 99) <= SHORT.swap_bound_s


@pytest.mark.xfail(
    strict=True,
    reason="not reached: packed 0.983x dedicated on 8 cards (goal 0.99). Nearly all its misses are"
    " requests that found a 14B or 32B asleep: sleep.after puts an idle engine to sleep "
    "whether or not its memory is wanted, and dedicated never sleeps. Wakes scale with a "
    "model's weights (a 32B's is 4x an 8B's: 8 s at the default 2 s), past the 5 s SLO for "
    "the 14B and 32B models.",
)
def test_packed_reaches_dedicated_on_eight_cards(packing):
    assert packing["ratios"]["zipf-8"] >= 0.99


@pytest.mark.xfail(
    strict=True,
    reason="not reached: packed 0.682x dedicated on 4 cards (goal 0.95): 24 models in 4 x 80 GB "
    "swap 1,223 times and cold-start 427 times in 30 min (p99 woken 169 s); processor "
    "sharing, the pessimistic bound, slows every card's engines together",
)
def test_packed_reaches_most_of_dedicated_on_four_cards(packing):
    assert packing["ratios"]["zipf-4"] >= 0.95


def test_packed_needs_at_most_half_the_cards_sleep_needs_on_the_aegaeon_shaped_trace(packing):
    sleep, packed = packing["cards"]["aegaeon"]["sleep"], packing["cards"]["aegaeon"]["packed"]
    assert packed is not None, "packed never reaches 0.99x dedicated"
    assert sleep is None or packed * 2 <= sleep, (sleep, packed)


@pytest.mark.xfail(
    strict=True,
    reason="not reached: on the short Zipf trace (12 models) neither sleep nor packed reaches "
    "0.99x dedicated at any number of cards up to dedicated's (the woken 14B and 32B "
    "requests, as on 8 cards), so the ratio is not defined; on the Aegaeon-shaped trace "
    "packed needs 1 card and sleep 4",
)
def test_packed_needs_at_most_half_the_cards_sleep_needs_on_the_zipf_trace(packing):
    sleep, packed = packing["cards"]["zipf"]["sleep"], packing["cards"]["zipf"]["packed"]
    assert packed is not None, "packed never reaches 0.99x dedicated"
    assert sleep is None or packed * 2 <= sleep, (sleep, packed)

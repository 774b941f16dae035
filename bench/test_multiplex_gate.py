"""The premise of sleeping engines, on a short trace: with sleep, a fleet with three times more
models than cards serves far more requests within the TTFT SLO than making room by cold starts,
and comes near cards of their own for every model. The figures come from the control plane's
own decisions on a virtual clock (bench/multiplex.py), so the ratios do not move with the
machine's load; the full table is `python -m bench.multiplex`."""

from bench.figures import record
from bench.multiplex import Settings, compare, percentile

SHORT = Settings(models=12, cards=4, minutes=6, warmup_minutes=8, rate=0.3, cv=2.0, seed=3)


def test_sleep_serves_what_cold_starts_cannot_and_loses_nothing():
    results = compare(SHORT)
    pinned, cold, sleep, dedicated = (results[p] for p in ("pinned", "cold", "sleep", "dedicated"))
    record(
        f"multiplex ({SHORT.models} models on {SHORT.cards} cards, CV {SHORT.cv:g}): within the"
        f" {SHORT.slo_s:g} s SLO sleep {sleep.attainment:.0%}, cold {cold.attainment:.0%},"
        f" pinned {pinned.attainment:.0%}, dedicated {dedicated.attainment:.0%}; swapped TTFT"
        f" p50 sleep {percentile(sleep.swapped_ttft, 50):.1f} s, cold"
        f" {percentile(cold.swapped_ttft, 50):.1f} s; wakes {sleep.wakes}, cold starts"
        f" {sleep.cold_starts} against {cold.cold_starts}"
    )
    assert all(r.lost == 0 for r in results.values()), {p: r.lost for p, r in results.items()}
    assert sleep.attainment >= 2 * cold.attainment
    assert sleep.attainment >= 0.6 * dedicated.attainment
    assert percentile(sleep.swapped_ttft, 50) <= 0.25 * percentile(cold.swapped_ttft, 50)
    assert sleep.wakes > sleep.cold_starts, "swaps are wakes, not cold starts"
    assert sleep.gpu_seconds_awake <= cold.gpu_seconds_awake

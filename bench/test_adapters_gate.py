"""Fine-tunes as adapters on a few base replicas against the same fine-tunes as models of their
own, on a short trace (bench/adapters.py): adapters serve nearly every request within the SLO,
none reaches a replica without its adapter, none is lost. Decisions are the control plane's on
a virtual clock, so the figures do not move with the machine's load."""

from bench.adapters import compare
from bench.figures import record
from bench.multiplex import Settings, percentile

SHORT = Settings(models=100, cards=4, minutes=2, rate=2.0, cv=2.0, warmup_minutes=2.0, seed=5)


def test_adapters_serve_what_models_of_their_own_cannot_and_never_miss():
    results = compare(SHORT, max_adapters=8)
    adapters, models = results["adapters"], results["models"]
    record(
        f"adapters ({SHORT.models} fine-tunes, {SHORT.cards} base replicas of 8): within the"
        f" {SHORT.slo_s:g} s SLO {adapters.attainment:.0%} as adapters,"
        f" {models.attainment:.0%} as models; p99 TTFT {percentile(adapters.ttft, 99):.1f} s;"
        f" {adapters.loads} loads, {adapters.unloads} unloads; reached without adapter"
        f" {adapters.misses}"
    )
    assert adapters.misses == 0, "a request reached a replica without its adapter"
    assert adapters.lost == 0 and models.lost == 0
    assert adapters.attainment >= 0.9
    assert adapters.attainment >= 3 * models.attainment
    assert adapters.unloads > 0, "the trace fills the replicas: adapters had to make way"

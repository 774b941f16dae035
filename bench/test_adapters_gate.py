"""Fine-tunes as adapters gpufleet places, against vLLM's own adapter cache (every adapter on
every replica, least recently used swapped by the engine) on the same cards and trace, at the
real processes' default timing with route propagation (bench/adapters.py): gpufleet's way
serves at least as many requests within the SLO, sends none where its adapter is not, and
cuts none by an unload. The full table, models that sleep included, is
`python -m bench.adapters`."""

import pytest

from bench.adapters import compare
from bench.figures import record
from bench.multiplex import Settings, percentile

# Measured on bench/fleetsim.py's simulated clock: it may run beside other tests.
pytestmark = pytest.mark.virtual_clock

SHORT = Settings(models=100, cards=4, minutes=2, rate=2.0, cv=2.0, warmup_minutes=2.0, seed=5,
                 sized=False)


def test_adapters_serve_at_least_as_well_as_the_engines_own_cache_and_never_miss():
    results = compare(SHORT, max_adapters=8, ways=("adapters", "vllm-native"))
    ours, native = results["adapters"], results["vllm-native"]
    record(
        f"adapters ({SHORT.models} fine-tunes, {SHORT.cards} base replicas of 8): within the"
        f" {SHORT.slo_s:g} s SLO {ours.attainment:.1%} placed by gpufleet,"
        f" {native.attainment:.1%} in vLLM's own cache; p99 TTFT"
        f" {percentile(ours.ttft, 99):.2f} s against {percentile(native.ttft, 99):.2f} s;"
        f" {ours.loads} loads, {ours.unloads} unloads against {native.loads} loads;"
        f" failed {ours.failed}, cut {ours.cut}"
    )
    for way, r in results.items():
        assert r.failed == 0, f"{way}: {r.failed} requests reached a replica without the adapter"
        assert r.cut == 0, f"{way}: {r.cut} requests cut by an unload"
        assert r.refused == 0, f"{way}: {r.refused} refused"
    assert ours.attainment >= native.attainment
    assert ours.unloads > 0, "the trace fills the replicas: adapters had to make way"


def test_adapters_loaded_where_the_request_lands_match_the_engines_own_cache():
    """Engines with a LoRA resolver (`adapter_resolver`): a request no holder can take at once
    lands on a replica with a free slot, whose engine loads the adapter, and the control plane
    keeps a slot free on each replica. Its tail is no longer than vLLM's own cache's, on the
    same trace, and nothing goes where it cannot be served."""
    results = compare(SHORT, max_adapters=8, ways=("resolver", "vllm-native"))
    ours, native = results["resolver"], results["vllm-native"]
    p99, native_p99 = percentile(ours.ttft, 99), percentile(native.ttft, 99)
    record(
        f"adapters with a resolver ({SHORT.models} fine-tunes, {SHORT.cards} replicas of 8):"
        f" within the SLO {ours.attainment:.1%} against vLLM's own cache's"
        f" {native.attainment:.1%}; p99 TTFT {p99:.2f} s against {native_p99:.2f} s; p50"
        f" {percentile(ours.ttft, 50):.2f} s against {percentile(native.ttft, 50):.2f} s;"
        f" {len(ours.swapped_ttft)} waited for the control plane; failed {ours.failed}"
    )
    assert ours.failed == 0 and ours.cut == 0 and ours.refused == 0
    assert ours.attainment >= native.attainment
    assert p99 <= native_p99 + 1e-6, "(the same load time and engine TTFT, summed in floats)"

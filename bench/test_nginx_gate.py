"""gpurouter at the defaults against nginx in front of the same backend, per core: both at once
on one CPU with the load taking turns (bench/compare_routers.py --nginx --paired),
forty-one rounds of 1 s, each of fresh processes, gated on the mean of the middle half of the
rounds (what spreads a round is its pair of processes, so many short rounds: 21 of 2 s read
0.974-0.996 on one machine, 41 of 1 s 0.972).

The goal is 1.2x nginx's rate per core; the bar a landing must hold is 1.0x. Where the time
goes, and what the router does per request that nginx does not, is in docs/operations.md
("Where a request's time goes").
"""

import pytest

from bench.compare_routers import NGINX_RATIO, nginx_binary
from bench.figures import record
from bench.paired_gate import run_paired

GOAL = 1.2


@pytest.fixture(scope="module")
def against_nginx():
    if not nginx_binary():
        raise RuntimeError("nginx is neither on the PATH nor beside the venv's python: `make`")
    found = run_paired("--nginx", 41, None, slices=8, seconds=1.0)
    record(
        f"gpurouter / nginx, rate per core at the defaults: {found.central}x, the mean of the"
        f" middle half of the rounds (bar {NGINX_RATIO}, goal {GOAL}; median {found.median};"
        f" pooled {found.pooled}; rounds {found.rounds})"
    )
    return found


# raises: only the figure under its bound is expected; a run that fails is a failure.
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="not reached: 0.97-1.00 on an AMD EPYC (Zen 5), 0.91-0.97 on the machines before"
    " (rounds 0.73-1.16). The kernel's share per request (two reads, two writes) is nginx's;"
    " the router's own code costs more user CPU an answer than nginx's (13.7 µs against 11.2"
    " there); of its 23,100 instructions a request, 1,800 are the GIL taken back at each of"
    " uvloop's callbacks",
)
def test_the_router_serves_at_least_nginxs_rate_per_core(against_nginx):
    assert against_nginx.central >= NGINX_RATIO, against_nginx.output


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="not reached: 0.91-1.00 (goal 1.2): a bare uvloop relay, which parses nothing,"
    " measured 1.24",
)
def test_the_router_serves_a_fifth_more_than_nginx_per_core(against_nginx):
    assert against_nginx.central >= GOAL, against_nginx.output

"""Swap overhead: a model that does not fit is asked for while an idle one holds the cards;
how much longer than the unavoidable part the first answer takes. The unavoidable part is
measured in the same run: the victim's stop (Stopping to its cards free, which the newcomer's
placement marks) plus the newcomer's engine start-up (placed to Ready). What is left is the
decision, the safe stop's wait for the routers' acks, and the route reaching the router."""

import time

import openai
import pytest

from bench.figures import record
from tests.harness import call, post, wait_until
from tests.test_making_room_end_to_end import RESIDENCY_S, chat, start

pytestmark = pytest.mark.integration
# Sim engines that take 3 s to load: real ones take from seconds (a small model from page
# cache) to minutes, so a fixed overhead weighs less on them than here.
STARTUP_S = 3.0


def event_at(fleet, model, predicate) -> float:
    rows = call("GET", f"{fleet.url}/v1/models/{model}")[1]["events"]
    return [e["at"] for e in rows if predicate(e["message"])][-1]


def test_a_swap_costs_little_beyond_the_victims_stop_and_the_newcomers_start_up(
    benchmark, procs, tmp_path
):
    fleet = start(procs, tmp_path, startup_s=STARTUP_S)
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    wait_until(
        lambda: post(router + "/v1/chat/completions", chat("alpha"))[0] == 200,
        timeout=30,
        what="alpha",
    )
    time.sleep(RESIDENCY_S)
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)

    def ask():
        asked = time.monotonic()
        api.chat.completions.create(model="beta", messages=[], max_tokens=2)
        return time.monotonic() - asked

    first_answer = benchmark.pedantic(ask, rounds=1)
    stopping = event_at(fleet, "alpha", lambda m: " Stopping: " in m)
    placed = event_at(fleet, "beta", lambda m: " placed on " in m and "after" not in m)
    ready = event_at(fleet, "beta", lambda m: m.endswith(" Ready"))
    stop_s, startup_s = placed - stopping, ready - placed
    ratio = first_answer / (stop_s + startup_s)
    benchmark.extra_info.update(
        {"first_answer_s": first_answer, "victim_stop_s": stop_s, "startup_s": startup_s}
    )
    record(
        f"swap: first answer {first_answer:.2f} s after the request; victim's stop"
        f" {stop_s:.2f} s + newcomer's start-up {startup_s:.2f} s: overhead"
        f" {1000 * (first_answer - stop_s - startup_s):.0f} ms, ratio {ratio:.2f}"
    )
    assert ratio <= 1.5

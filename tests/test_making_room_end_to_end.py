"""More models than cards, with real processes: control plane, sim agent on one node of two
GPUs, routers, and sim engines that take a second to 'load their weights'. Every model needs
both GPUs, so only one runs at a time, and a request for another takes the cards of the one
nobody is using."""

import json
import threading
import time

import openai
import pytest
from click.testing import CliRunner

from cli.main import gpuctl
from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, get, post, wait_until
from tests.router.fake_upstreams import relaying

pytestmark = pytest.mark.integration
ONE_NODE = {"fabrics": [{"name": "ib-a", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 2}]}
STARTUP_S = 1.0
RESIDENCY_S = 3.0
ASKED_IN_TURN = 12


def whole_node_spec(name, startup_s=STARTUP_S, **fields):
    command = [
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}",
        "--startup-delay", str(startup_s), "--ttft", "0.02", "--tokens-per-s", "20",
        "--output-tokens", "100",
    ]  # fmt: skip
    fields = {
        "gpus_per_replica": 2,
        "min_replicas": 0,
        "min_residency": f"{RESIDENCY_S}s",
        "scale_to_zero_after": "1h",
        **fields,
    }
    return spec(name=name, command=command, **fields)


def chat(model, max_tokens=4):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({**body, "max_tokens": max_tokens}).encode()


def model_row(fleet, name):
    return call("GET", f"{fleet.url}/v1/models/{name}")[1]


def events(fleet, name):
    return [e["message"] for e in model_row(fleet, name)["events"]]


def ready_replicas(fleet, name):
    return [r for r in fleet.replicas("Ready") if r["model"] == name]


def start(procs, tmp_path, *server_args, models=("alpha", "beta"), startup_s=STARTUP_S, **fields):
    """The fleet with `models` applied in order: the first placed and Ready, the rest at zero."""
    fleet = SimFleet(procs, tmp_path, fleet=ONE_NODE, server_args=server_args)
    for name in models:
        body = whole_node_spec(name, startup_s, **fields.get(name, {}))
        call("POST", fleet.url + "/v1/models", body)
    wait_until(lambda: ready_replicas(fleet, models[0]), timeout=30, what=f"{models[0]} Ready")
    return fleet


def test_a_model_that_does_not_fit_is_served_once_an_idle_one_is_stopped_for_it(procs, tmp_path):
    fleet = start(procs, tmp_path)
    beta = model_row(fleet, "beta")
    # Nobody waits for it: at zero until a request comes, not an error.
    assert beta["state"] == "ScaledToZero" and not beta["reason"], beta
    assert call("GET", fleet.url + "/v1/summary")[1]["unplaceable"] == []
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    wait_until(lambda: post(router + "/v1/chat/completions", chat("alpha"))[0] == 200, what="alpha")
    (alpha,) = ready_replicas(fleet, "alpha")
    time.sleep(RESIDENCY_S)
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)
    asked = time.monotonic()
    answer = api.chat.completions.create(model="beta", messages=[], max_tokens=4)
    assert answer.choices[0].message.content and answer.model == "beta"
    assert time.monotonic() - asked < 30
    assert [r["model"] for r in fleet.replicas("Ready")] == ["beta"]
    assert any(
        f"{alpha['id']} Retiring: stopped to make room for beta" in e
        for e in events(fleet, "alpha")
    )
    assert any(f"after {alpha['id']} made way" in e for e in events(fleet, "beta"))
    status = call("GET", fleet.url + "/v1/summary")[1]
    wait_until(
        lambda: call("GET", fleet.url + "/v1/summary")[1]["room"]["swaps_last_hour"] == 1,
        what="the swap counted",
    )
    metrics = get(fleet.url + "/metrics")[1].decode()
    assert 'gpufleet_swaps_total{model="beta"} 1' in metrics
    assert "gpufleet_swap_seconds_count 1" in metrics
    screen = CliRunner().invoke(gpuctl, ["--server", fleet.url, "status"], env={"NO_COLOR": "1"})
    assert "1 swap(s) in the last hour" in screen.output, screen.output
    assert status["room"]["waiting_for_room"] == {}


def test_a_replica_with_a_stream_in_flight_is_never_stopped_under_it(procs, tmp_path):
    fleet = start(procs, tmp_path)
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    wait_until(lambda: post(router + "/v1/chat/completions", chat("alpha"))[0] == 200, what="alpha")
    time.sleep(RESIDENCY_S)
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)
    streamed, ended = [], []

    def stream():
        chunks = api.chat.completions.create(
            model="alpha", messages=[], max_tokens=80, stream=True
        )  # 80 tokens at 20/s: 4 s in flight
        for chunk in chunks:
            streamed.append(chunk)
        ended.append(time.monotonic())

    streaming = threading.Thread(target=stream)
    streaming.start()
    wait_until(lambda: len(streamed) >= 3, what="the stream under way")
    time.sleep(0.8)  # a router report carries it in flight
    answer = api.chat.completions.create(model="beta", messages=[], max_tokens=4)
    answered = time.monotonic()
    streaming.join(30)
    assert answer.model == "beta"
    assert streamed[-1].choices[0].finish_reason is not None, "the stream was cut"
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert len(text.split()) >= 60
    assert ended and answered >= ended[0], "beta was served only after the stream ended"
    reasons = " ".join(events(fleet, "beta"))
    assert "in flight" in reasons, reasons


def test_unknown_use_is_never_taken_and_the_wait_says_why(procs, tmp_path):
    fleet = start(procs, tmp_path, "--router-live", "2")
    with relaying(int(fleet.url.rsplit(":", 1)[1])) as relay:
        cut_router, _ = procs.router("--control-plane", relay.url, "--tick", "0.3")
        wait_until(
            lambda: post(cut_router + "/v1/chat/completions", chat("alpha"))[0] == 200,
            what="alpha through the router about to be cut",
        )
        router, _ = procs.router(
            "--control-plane", fleet.url, "--tick", "0.3", "--park-timeout", "6"
        )
        wait_until(
            lambda: post(router + "/v1/chat/completions", chat("alpha"))[0] == 200,
            what="alpha through the other router",
        )
        relay.cut()
        wait_until(
            lambda: call("GET", fleet.url + "/v1/summary")[1]["routers"]["silent"] == 1,
            what="the cut router silent",
        )
        (alpha,) = [r["id"] for r in ready_replicas(fleet, "alpha")]
        status, _, body = post(router + "/v1/chat/completions", chat("beta"), timeout=30)
        assert status == 503, body
        message = json.loads(body)["error"]["message"]
        assert "within 6s" in message and "use unknown: silent router" in message, message
        assert [r["id"] for r in ready_replicas(fleet, "alpha")] == [alpha], "unknown, taken"
        row = model_row(fleet, "beta")
        assert row["state"] in ("WaitingForRoom", "ScaledToZero"), row


def test_min_residency_is_kept_and_two_models_never_swap_faster(procs, tmp_path):
    fleet = start(procs, tmp_path)
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)
    readied = {}
    for name in ("alpha", "beta", "alpha", "beta"):
        api.chat.completions.create(model=name, messages=[], max_tokens=2)
        (replica,) = ready_replicas(fleet, name)
        readied.setdefault(replica["id"], time.time())
    # Each victim served for at least min_residency after it turned Ready: read it from the
    # events, the control plane's own clock.
    taken = set()
    for name in ("alpha", "beta"):
        rows = model_row(fleet, name)["events"]
        ready_at = {
            e["message"].split()[1]: e["at"] for e in rows if e["message"].endswith(" Ready")
        }
        for e in rows:
            if "Retiring: stopped to make room for" in e["message"]:
                victim = e["message"].split()[1]
                assert e["at"] - ready_at[victim] >= RESIDENCY_S - 0.05, (victim, rows)
                taken.add(victim)
    assert len(taken) == 3


def test_a_higher_priority_takes_room_from_a_lower_and_never_the_reverse(procs, tmp_path):
    fleet = start(procs, tmp_path, models=("vip", "low"), vip={"priority": 10})
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    wait_until(lambda: post(router + "/v1/chat/completions", chat("vip"))[0] == 200, what="vip")
    time.sleep(RESIDENCY_S)
    asked = time.monotonic()
    status, _, body = post(router + "/v1/chat/completions", chat("low"), timeout=30)
    assert status == 503 and time.monotonic() - asked < 5, "protected for good: answered at once"
    assert "priority 10 above low's 0" in json.loads(body)["error"]["message"]
    assert ready_replicas(fleet, "vip"), "the higher priority kept its room"
    # The other way round: a lower priority's idle replica is taken.
    call("POST", fleet.url + "/v1/models", whole_node_spec("vip", priority=-1))
    status, _, body = post(router + "/v1/chat/completions", chat("low"), timeout=30)
    assert status == 200, body


def test_two_models_asked_for_in_turn_a_few_seconds_apart_are_all_served(procs, tmp_path):
    """Each request comes while the other model still holds the cards, or is on its way in
    or out: every one waits its turn; none is told the model cannot be started."""
    turns = {"min_residency": "2s"}
    fleet = start(procs, tmp_path, startup_s=3.0, alpha=turns, beta=turns)
    router, _ = procs.router("--control-plane", fleet.url)  # the default pacing
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=90)
    outcomes: dict[int, str] = {}

    def ask(i: int, name: str) -> None:
        try:
            api.chat.completions.create(model=name, messages=[], max_tokens=2)
            outcomes[i] = "served"
        except openai.APIStatusError as exc:
            outcomes[i] = f"{exc.status_code}: {exc.message}"

    threads = []
    for i in range(ASKED_IN_TURN):
        threads.append(threading.Thread(target=ask, args=(i, ("beta", "alpha")[i % 2])))
        threads[-1].start()
        time.sleep(3.0)
    for thread in threads:
        thread.join(timeout=120)
    assert outcomes == dict.fromkeys(range(ASKED_IN_TURN), "served"), outcomes

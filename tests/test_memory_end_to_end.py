"""Memory held is what the card holds, with real processes: control plane, a sim agent whose
one 80 GB card refuses an allocation past its memory as a real one does (sim/fleet.py), router,
sim engines. The three moves that over-committed a card (a model deleted while it streams, a
new model while another falls asleep, a wake that times out) each end with every engine served
and the card never having refused one."""

import threading
import time

import openai
import pytest

from tests.agent.test_agent_sim import SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, wait_until

pytestmark = pytest.mark.integration
ONE_CARD = {"fabrics": [{"name": "ib-a", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 1}]}
CARD_MB = 81559


def engine(name: str, gpu_memory: str, *flags: str, **fields) -> dict:
    command = [
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}",
        "--startup-delay", "0.3", "--ttft", "0.02", *flags,
    ]  # fmt: skip
    body = {"min_residency": "1s", "gpu_memory": gpu_memory, **fields}
    return spec(name=name, command=command, **body)


def cards(fleet) -> dict:
    (card,) = call("GET", f"http://127.0.0.1:{fleet.admin_port}/cards")[1]["items"]
    return card


def never_refused(fleet) -> None:
    card = cards(fleet)
    assert card["refusals"] == [], card
    assert sum(card["held"].values()) <= CARD_MB - 2048, card


def states(fleet) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for row in fleet.replicas():
        out.setdefault(row["model"], []).append(row["state"])
    return out


def watch_the_card(fleet, seen: list, done: threading.Event) -> threading.Thread:
    """What the card holds, read every 50 ms until `done`: the most it ever held."""

    def read():
        while not done.is_set():
            seen.append(sum(cards(fleet)["held"].values()))
            time.sleep(0.05)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_model_deleted_while_it_streams_keeps_its_card_until_its_engine_is_gone(
    procs, tmp_path
):
    fleet = SimFleet(procs, tmp_path, fleet=ONE_CARD)
    long_stream = ("--tokens-per-s", "20", "--output-tokens", "60")
    assert call("POST", fleet.url + "/v1/models", engine("a", "60GB", *long_stream))[0] == 201
    wait_until(lambda: states(fleet).get("a") == ["Ready"], timeout=30, what="a Ready")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)
    wait_until(lambda: [m.id for m in api.models.list()] == ["a"], what="a's route")
    streamed: list[str] = []

    def stream():
        chunks = api.chat.completions.create(model="a", messages=[], stream=True)
        streamed.extend(c.choices[0].delta.content or "" for c in chunks if c.choices)

    streaming = threading.Thread(target=stream)
    streaming.start()
    time.sleep(0.5)
    assert call("DELETE", fleet.url + "/v1/models/a")[0] in (200, 204)
    assert call("POST", fleet.url + "/v1/models", engine("b", "40GB"))[0] == 201
    time.sleep(1.0)
    assert "b" not in states(fleet) or states(fleet)["b"] == [], states(fleet)
    streaming.join(timeout=30)
    assert len("".join(streamed).split()) >= 50, "a's stream ran to its end"
    wait_until(lambda: states(fleet).get("b") == ["Ready"], timeout=30, what="b Ready")
    assert "a" not in states(fleet)
    answer = api.chat.completions.create(model="b", messages=[], max_tokens=2)
    assert answer.model == "b"
    never_refused(fleet)


def sleepy(name: str, gpu_memory: str, *flags: str, wake_timeout: str = "30s") -> dict:
    return engine(
        name, gpu_memory, *flags,
        engine="vllm", min_replicas=0, scale_to_zero_after="1h",
        sleep={"level": 1, "after": "2s", "wake_timeout": wake_timeout},
    )  # fmt: skip


def test_a_new_model_waits_for_an_engine_falling_asleep_to_give_its_memory_back(
    procs, tmp_path
):
    fleet = SimFleet(procs, tmp_path, fleet=ONE_CARD)
    body = sleepy("a", "60GB", "--sleep-delay", "3")
    assert call("POST", fleet.url + "/v1/models", body)[0] == 201
    wait_until(lambda: states(fleet).get("a") == ["Ready"], timeout=30, what="a Ready")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    seen: list[int] = []
    done = threading.Event()
    watcher = watch_the_card(fleet, seen, done)
    wait_until(lambda: states(fleet).get("a") == ["Sleeping"], timeout=30, what="a falling asleep")
    assert call("POST", fleet.url + "/v1/models", engine("b", "40GB", min_replicas=1))[0] == 201
    time.sleep(1.0)
    if states(fleet).get("a") == ["Sleeping"]:
        assert "b" not in states(fleet), "its engine still holds 60 GB"
    wait_until(lambda: states(fleet).get("b") == ["Ready"], timeout=30, what="b Ready")
    assert states(fleet)["a"] == ["Asleep"], "b went beside a's reserve"
    done.set()
    watcher.join(timeout=5)
    assert max(seen) <= CARD_MB - 2048, max(seen)
    never_refused(fleet)


def test_a_wake_that_times_out_holds_its_card_until_its_engine_is_gone(procs, tmp_path):
    fleet = SimFleet(procs, tmp_path, fleet=ONE_CARD)
    body = sleepy("a", "60GB", "--wake-delay", "30", wake_timeout="3s")
    assert call("POST", fleet.url + "/v1/models", body)[0] == 201
    wait_until(lambda: states(fleet).get("a") == ["Ready"], timeout=30, what="a Ready")
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3", "--park-timeout", "60")
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)
    wait_until(lambda: states(fleet).get("a") == ["Asleep"], timeout=30, what="a asleep")
    (first,) = [r["id"] for r in fleet.replicas()]
    answers: list = []

    def ask():
        answers.append(api.chat.completions.create(model="a", messages=[], max_tokens=2))

    asking = threading.Thread(target=ask)
    asking.start()  # parked: its request wakes a, whose engine takes 30 s to
    wait_until(
        lambda: any(r["id"] != first for r in fleet.replicas()), timeout=30, what="a cold start"
    )
    asking.join(timeout=40)
    assert answers and answers[0].model == "a", "served by the cold start"
    rows = {r["id"]: r for r in fleet.replicas()}
    assert first not in rows or rows[first]["state"] == "Failed", rows
    never_refused(fleet)

"""Autoscaling on load with real processes: control plane, sim agent (2 nodes of 2 GPUs),
router, and sim engines that stream slowly, so that requests stay in flight."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.agent.test_agent_sim import SERVER_ARGS, SimFleet
from tests.controlplane.conftest import spec
from tests.harness import call, control_plane, wait_until

pytestmark = pytest.mark.integration
STARTUP_S = 1.0
DELAY_S = 5.0
TICK_S = 0.2


def busy_spec(startup_s=STARTUP_S, **fields):
    command = [
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}",
        "--startup-delay", str(startup_s), "--ttft", "0.05", "--tokens-per-s", "20",
        "--output-tokens", "200",
    ]  # fmt: skip
    fields = {
        "replicas": 1,
        "min_replicas": 1,
        "max_replicas": 4,
        "target_in_flight": 4,
        "scale_down_delay": f"{DELAY_S}s",
        **fields,
    }
    return spec(name="busy", command=command, **fields)


def ready(fleet) -> int:
    return sum(1 for r in fleet.replicas("Ready") if r["model"] == "busy")


def events(fleet) -> list[dict]:
    return call("GET", fleet.url + "/v1/models/busy")[1]["events"]


class Load:
    """`streams` clients, each streaming requests back to back until stopped; every stream
    is checked whole (its last chunk has a finish reason and all its tokens came). Every load
    is stopped when its test ends, even one that failed before `end` (`loads_stopped`)."""

    running: list["Load"] = []

    def __init__(self, router: str, streams: int, tokens: int = 40) -> None:
        Load.running.append(self)
        self.api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)
        self.tokens = tokens
        self.stop = threading.Event()
        self.done, self.broken = [], []
        self.pool = ThreadPoolExecutor(streams)
        self.futures = [self.pool.submit(self.client) for _ in range(streams)]

    def client(self):
        while not self.stop.is_set():
            try:
                chunks = list(
                    self.api.chat.completions.create(
                        model="busy", messages=[], max_tokens=self.tokens, stream=True
                    )
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                whole = chunks[-1].choices[0].finish_reason and len(text.split()) == self.tokens
                (self.done if whole else self.broken).append(len(text.split()))
            except openai.APIError as exc:
                self.broken.append(repr(exc))

    def end(self):
        self.stop.set()
        for future in self.futures:
            future.result(timeout=60)
        self.pool.shutdown()
        assert self.broken == [], "a request failed or was cut"
        assert self.done


@pytest.fixture(autouse=True)
def loads_stopped():
    """A test that fails mid-load would leave its clients looping, and the run would never
    exit: their threads are joined when the interpreter ends."""
    yield
    while Load.running:
        load = Load.running.pop()
        load.stop.set()
        load.pool.shutdown(wait=True, cancel_futures=True)


def start(procs, tmp_path, startup_s=STARTUP_S, **fields):
    fleet = SimFleet(procs, tmp_path)
    call("POST", fleet.url + "/v1/models", busy_spec(startup_s, **fields))
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    return fleet, router


def test_a_step_of_load_scales_out_fast_and_back_in_after_the_delay_losing_nothing(procs, tmp_path):
    fleet, router = start(procs, tmp_path)
    wait_until(lambda: ready(fleet) == 1, timeout=30, what="the first replica")
    wait_until(lambda: call("GET", fleet.url + "/v1/routes")[1]["routes"]["busy"], what="route")
    stepped = time.monotonic()
    load = Load(router, 16)
    wait_until(lambda: ready(fleet) == 4, timeout=20, what="4 Ready replicas")
    reaction = time.monotonic() - stepped
    # Reports every 0.3 s, two ticks to double twice, then the engines' own start-up.
    assert reaction < 0.3 + 2 * TICK_S + STARTUP_S + 2.5, reaction

    # The recommendation is read a tick at a time from the routers' reports: wait for the
    # one that follows the fourth replica's start rather than read whichever came before.
    def recommends_four() -> bool:
        autoscale = call("GET", fleet.url + "/v1/models/busy")[1]["autoscale"]
        return autoscale["recommended"] == 4 and "target 4 -> 4" in autoscale["reason"]

    wait_until(recommends_four, timeout=5, what="the recommendation at 4, with its reason")
    time.sleep(1.5)
    # The load falls from when the clients stop starting requests, while their last streams
    # (2 s each) finish: the delay counts from the first of that, not from the last.
    stopping = time.monotonic()
    load.end()
    ended = time.monotonic()
    wait_until(lambda: ready(fleet) == 1, timeout=DELAY_S + 15, what="back to min_replicas")
    back = time.monotonic()
    assert DELAY_S <= back - stopping and back - ended <= DELAY_S + 5, (stopping, ended, back)
    messages = [e["message"] for e in events(fleet)]
    assert sum(m.startswith("scaled out") for m in messages) == 2, "1 -> 2 -> 4"
    assert sum(m.startswith("scaled in") for m in messages) == 3, "one a tick: 4 -> 3 -> 2 -> 1"


def test_from_zero_twelve_waiting_requests_start_three_replicas_at_once(procs, tmp_path):
    fleet, router = start(procs, tmp_path, replicas=0, min_replicas=0)
    wait_until(
        lambda: call("GET", fleet.url + "/v1/models/busy")[1]["state"] == "ScaledToZero",
        what="the model at zero",
    )
    api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=60)
    with ThreadPoolExecutor(12) as pool:
        answers = list(
            pool.map(
                lambda _: api.chat.completions.create(model="busy", messages=[], max_tokens=2),
                range(12),
            )
        )
    assert all(a.choices[0].message.content for a in answers)
    rows = events(fleet)
    first_ready = min(e["at"] for e in rows if e["message"].endswith(" Ready"))
    placed = [e["at"] for e in rows if " placed on " in e["message"]]
    assert len([at for at in placed if at < first_ready]) == 3, "three at once, not one by one"


def test_a_load_around_the_target_does_not_make_the_count_flap(procs, tmp_path):
    fleet, router = start(procs, tmp_path)
    wait_until(lambda: ready(fleet) == 1, timeout=30, what="the first replica")
    wait_until(lambda: call("GET", fleet.url + "/v1/routes")[1]["routes"]["busy"], what="route")
    # 5 streams of 8 tokens, then 3, in turn: in flight swings around the target of 4.
    for streams in (5, 3, 5, 3, 5, 3):
        load = Load(router, streams, tokens=8)
        time.sleep(1.2)
        load.end()
    messages = [e["message"] for e in events(fleet) if e["message"].startswith("scaled")]
    ins = [m for m in messages if m.startswith("scaled in")]
    assert len(ins) <= 1, messages
    assert len(messages) <= 2, messages


def test_a_control_plane_restart_mid_window_neither_scales_in_early_nor_forgets(procs, tmp_path):
    fleet, router = start(procs, tmp_path)
    wait_until(lambda: ready(fleet) == 1, timeout=30, what="the first replica")
    wait_until(lambda: call("GET", fleet.url + "/v1/routes")[1]["routes"]["busy"], what="route")
    load = Load(router, 8)
    wait_until(lambda: ready(fleet) == 2, timeout=20, what="2 Ready replicas")
    time.sleep(1.0)
    load.end()
    ended = time.monotonic()
    time.sleep(2.0)  # mid-window
    server = next(p for p in procs.started if "server" in p.args[1])
    procs.terminate(server)
    port = int(fleet.url.rsplit(":", 1)[1])
    control_plane(procs, tmp_path / "state.sqlite", None, *SERVER_ARGS, port=port)
    wait_until(lambda: ready(fleet) == 1, timeout=DELAY_S + 15, what="back to one replica")
    back = time.monotonic() - ended
    assert DELAY_S <= back <= DELAY_S + 5, back


def test_queues_inside_the_engines_scale_out_and_show_in_replicas_wide(procs, tmp_path):
    from click.testing import CliRunner

    from cli.main import gpuctl

    # One request at a time per engine: 6 streams leave 5 queued in it. In flight alone (6,
    # target 100) asks for one replica; the engine's queue (5 over a target of 2) for three.
    fleet = SimFleet(procs, tmp_path)
    body = busy_spec(target_in_flight=100, target_waiting=2, max_replicas=3)
    body["command"] += ["--max-num-seqs", "1"]
    call("POST", fleet.url + "/v1/models", body)
    router, _ = procs.router("--control-plane", fleet.url, "--tick", "0.3")
    wait_until(lambda: ready(fleet) == 1, timeout=30, what="the first replica")
    wait_until(lambda: call("GET", fleet.url + "/v1/routes")[1]["routes"]["busy"], what="route")
    load = Load(router, 6, tokens=10)
    try:
        wait_until(
            lambda: any(
                (r.get("engine_load") or {}).get("waiting", 0) >= 3
                for r in call("GET", fleet.url + "/v1/replicas")[1]["items"]
            ),
            timeout=10,
            what="the engine's queue reported",
        )
        shown = CliRunner().invoke(gpuctl, ["--server", fleet.url, "replicas", "-o", "wide"])
        header = shown.output.splitlines()[0].split()
        assert header[7:11] == ["WAITING", "RUNNING", "KV", "READ"], shown.output
        assert "s ago" in shown.output
        wait_until(lambda: ready(fleet) == 3, timeout=20, what="3 Ready replicas")
        reasons = [e["message"] for e in events(fleet) if e["message"].startswith("scaled out")]
        assert any("queued in engines, target 2 a replica" in m for m in reasons), reasons
    finally:
        load.end()

"""gpurouter following a real `gpuctl server`: routes in, activity out.

The test plays the node agent over the control plane's HTTP API (register, heartbeat with
replicas Ready at the sim engines' URLs), so that only the router and control plane are
under test here; the real agent has its own tests.
"""

import json
import signal
import socket
import threading
import time

import openai
import pytest

from tests.controlplane.conftest import make_node, spec
from tests.harness import call, control_plane, get, wait_until
from tests.router.fake_upstreams import relaying

pytestmark = pytest.mark.integration


class Fleet:
    def __init__(self, procs, tmp_path):
        self.procs = procs
        # The test plays the agent and heartbeats only when it brings replicas up: a node
        # timeout longer than any test keeps n1 Ready. At the default 15 s, a test that ran
        # long turned n1 NotReady and failed its replicas under it.
        self.url, _ = control_plane(
            procs, tmp_path / "state.sqlite", None, "--tick", "0.2", "--node-timeout", "3600"
        )
        call("POST", self.url + "/v1/nodes", make_node("n1", gpus=8))
        self.engines = {}
        self.ready = {}

    def model(self, name, replicas):
        call("POST", self.url + "/v1/models", spec(name=name, replicas=replicas))

    def bring_up(self):
        """Heartbeat: every assigned replica is Ready at its own sim engine."""
        assignments = call("POST", self.url + "/v1/nodes/n1/heartbeat", {"replicas": self.ready})
        for a in assignments[1]["assignments"]:
            if a["replica"] not in self.engines:
                self.engines[a["replica"]] = self.procs.engine(a["model"], ttft=0.02)
            self.ready[a["replica"]] = {"state": "Ready", "url": self.engines[a["replica"]]}
        call("POST", self.url + "/v1/nodes/n1/heartbeat", {"replicas": self.ready})

    def replicas(self):
        return {r["id"]: r for r in call("GET", self.url + "/v1/replicas")[1]["items"]}

    def serve(self, **models):
        """Apply `models` ({name: replicas}), bring them up, and start a router on them."""
        for name, replicas in models.items():
            self.model(name, replicas)
        total = sum(models.values())
        wait_until(
            lambda: (
                len(call("POST", self.url + "/v1/nodes/n1/heartbeat", {})[1]["assignments"])
                == total
            ),
            what="placement",
        )
        self.bring_up()
        return self.router()

    def router(self, *extra, control_plane=None):
        router, proc = self.procs.router(
            "--control-plane",
            control_plane or self.url,
            "--tick",
            "0.3",
            "--router-id",
            "edge-1",
            "--metrics-token",
            METRICS_TOKEN,
            *extra,
        )
        wait_until(lambda: len(activity(router)["watched"]) == len(self.ready), what="routes")
        return router, proc


METRICS_TOKEN = "metrics-secret"
METRICS = {"Authorization": f"Bearer {METRICS_TOKEN}"}  # what reads a router's metrics sends


def activity(router):
    return json.loads(get(router + "/activity", METRICS)[1])


def test_activity_report_and_router_restart(procs, tmp_path):
    fleet = Fleet(procs, tmp_path)
    router, proc = fleet.serve(chat=1, embed=1)
    (chat,) = [r for r in fleet.replicas().values() if r["model"] == "chat"]
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
    api.chat.completions.create(model="chat", messages=[])
    assert {m.id for m in api.models.list()} == {"chat", "embed"}
    get(router + "/metrics")
    get(router + "/healthz")
    report = activity(router)
    assert set(report["used"]) == {chat["id"]}, "models, metrics and health are not use"
    assert set(report["watched"]) == set(fleet.replicas())
    wait_until(
        lambda: fleet.replicas()[chat["id"]]["idle_state"] == "exact",
        what="the control plane to hear of the use",
    )
    (embed,) = [r for r in fleet.replicas().values() if r["model"] == "embed"]
    assert embed["idle_state"] == "at_least"

    first_watch = time.monotonic()
    procs.terminate(proc)  # SIGTERM: drains, then says goodbye
    wait_until(
        lambda: fleet.replicas()[embed["id"]]["idle_state"] == "unknown",
        timeout=5,
        what="a router that said goodbye to leave no live router",
    )
    time.sleep(2)
    router, proc = fleet.router()
    assert activity(router)["used"] == {}
    wait_until(
        lambda: fleet.replicas()[embed["id"]]["idle_state"] == "at_least",
        what="the restarted router's report",
    )
    # A clean handover leaves no gap: the new incarnation carries the old one's watch on.
    assert fleet.replicas()[embed["id"]]["idle_s"] >= time.monotonic() - first_watch - 3
    procs.terminate(proc, signal.SIGKILL)
    crashed = time.monotonic()
    router, _ = fleet.router()
    wait_until(
        lambda: (
            fleet.replicas()[embed["id"]]["idle_state"] == "at_least"
            and fleet.replicas()[embed["id"]]["idle_s"] < 5
        ),
        what="the successor's report",
    )
    bound = fleet.replicas()[embed["id"]]["idle_s"]
    assert bound <= time.monotonic() - crashed + 1, "a crash restarts the bound"
    assert fleet.replicas()[chat["id"]]["idle_state"] == "at_least", "a use may hide in the gap"


def test_a_router_cut_off_from_the_control_plane_makes_its_replicas_unknown(procs, tmp_path):
    fleet = Fleet(procs, tmp_path)
    fleet.serve(chat=2)
    with relaying(int(fleet.url.rsplit(":", 1)[1])) as relay:
        router, _ = fleet.router("--router-id", "edge-cut", control_plane=relay.url)
        api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0, timeout=5)
        stop = threading.Event()
        served = []

        def traffic():
            while not stop.is_set():
                api.chat.completions.create(model="chat", messages=[])
                served.append(time.monotonic())
                time.sleep(0.2)

        sender = threading.Thread(target=traffic)
        sender.start()
        try:
            wait_until(
                lambda: all(r["idle_state"] == "exact" for r in fleet.replicas().values()),
                what="uses reported",
            )
            relay.cut()
            cut_at = time.monotonic()
            while time.monotonic() - cut_at < 14:
                summary = call("GET", fleet.url + "/v1/summary?idle_after=8")[1]
                assert summary["idle"]["replicas"] == [], "a replica in use listed as idle"
                time.sleep(0.5)
            states = {r["idle_state"] for r in fleet.replicas().values()}
            assert states == {"unknown"}
            assert summary["routers"]["silent"] == 1 and summary["routers"]["unknown_replicas"] == 2
            assert served[-1] > cut_at + 10, "the router kept serving while cut off"
            relay.heal()
            wait_until(
                lambda: all(r["idle_state"] == "exact" for r in fleet.replicas().values()),
                timeout=10,
                what="the uses made during the cut",
            )
            # The uses made during the cut came with the first report: nothing reads as idle
            # for the 14 s it lasted.
            assert all(r["idle_s"] < 5 for r in fleet.replicas().values())
        finally:
            stop.set()
            sender.join()


def test_silent_routers_stay_silent_across_a_control_plane_restart(procs, tmp_path):
    fleet = Fleet(procs, tmp_path)
    fleet.serve(chat=1)
    with relaying(int(fleet.url.rsplit(":", 1)[1])) as relay:
        fleet.router("--router-id", "edge-cut", control_plane=relay.url)

        def cut_router():
            rows = call("GET", fleet.url + "/v1/routers")[1]["items"]
            return next((r for r in rows if r["id"] == "edge-cut"), None)

        wait_until(
            lambda: (cut_router() or {}).get("replicas_watched") == 1,
            what="a report with the router's table",
        )
        relay.cut()
        server = next(p for p in procs.started if "server" in p.args)
        procs.terminate(server)
        port = int(fleet.url.rsplit(":", 1)[1])
        control_plane(procs, tmp_path / "state.sqlite", None, "--tick", "0.2", port=port)
        wait_until(
            lambda: cut_router()["state"] == "silent",
            timeout=20,
            what="the router to be silent after the restart",
        )
        fleet.bring_up()
        (replica,) = fleet.replicas().values()
        assert replica["idle_state"] == "unknown", "its table survived the restart"
        status, answer = call("DELETE", fleet.url + "/v1/routers/edge-cut")
        assert status == 200 and cut_router() is None


def test_route_updates_under_traffic_lose_no_request(procs, tmp_path):
    fleet = Fleet(procs, tmp_path)
    router, _ = fleet.serve(chat=2)
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0, timeout=10)
    failures, done = [], []
    stop = threading.Event()

    def traffic():
        while not stop.is_set() and len(done) < 2000:
            try:
                api.chat.completions.create(model="chat", messages=[])
                done.append(1)
            except Exception as exc:  # every failure is reported below
                failures.append(repr(exc))

    workers = [threading.Thread(target=traffic) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        for replicas in (4, 1, 3, 2):
            call("POST", fleet.url + "/v1/models/chat/scale", {"replicas": replicas})
            for _ in range(5):
                time.sleep(0.1)
                fleet.bring_up()
            wait_until(lambda n=replicas: len(activity(router)["watched"]) == n, what="new routes")
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert failures == []
    assert len(done) > 20


def test_router_keeps_serving_its_last_table_while_the_control_plane_is_down(procs, tmp_path):
    fleet = Fleet(procs, tmp_path)
    router, _ = fleet.serve(chat=1)
    api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0, timeout=5)
    server = next(p for p in procs.started if "server" in p.args)
    procs.terminate(server)
    for _ in range(20):
        assert api.chat.completions.create(model="chat", messages=[]).choices
    port = int(fleet.url.rsplit(":", 1)[1])
    control_plane(procs, tmp_path / "state.sqlite", None, "--tick", "0.2", port=port)
    wait_until(
        lambda: fleet.replicas()[next(iter(fleet.ready))]["idle_state"] == "exact",
        timeout=15,
        what="reports to reach the restarted control plane",
    )


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL])
def test_rolling_router_restarts_keep_bounds_honest(procs, tmp_path, stop_signal):
    # DESIGN.md's rolling restart, scaled down: two routers restarted in turn every 3 s for
    # 27 s, models idle after 12 s. By SIGTERM the never-used replica is listed once it has
    # been watched for 12 s in all, across restarts; by SIGKILL each death restarts its bound.
    # Either way the replica in use is never listed.
    fleet = Fleet(procs, tmp_path)
    for name in ("used", "never"):
        call("POST", fleet.url + "/v1/models", spec(name=name, replicas=1, idle_after="12s"))
    wait_until(
        lambda: len(call("POST", fleet.url + "/v1/nodes/n1/heartbeat", {})[1]["assignments"]) == 2,
        what="placement",
    )
    fleet.bring_up()
    ids = {r["model"]: r["id"] for r in fleet.replicas().values()}
    routers = {name: fleet.router("--router-id", name) for name in ("edge-a", "edge-b")}
    started = time.monotonic()
    stop = threading.Event()
    last_use, failures = [], []

    def traffic():
        while not stop.is_set():
            for url, _ in list(routers.values()):
                try:
                    api = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=2)
                    api.chat.completions.create(model="used", messages=[])
                    last_use.append(time.monotonic())
                except openai.APIConnectionError:
                    continue  # that router is restarting
                except openai.APIError as exc:
                    failures.append(repr(exc))
            time.sleep(0.3)

    sender = threading.Thread(target=traffic)
    sender.start()
    listed_at = None
    try:
        for turn in range(9):
            name = ("edge-a", "edge-b")[turn % 2]
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                listed = {
                    r["id"] for r in call("GET", fleet.url + "/v1/summary")[1]["idle"]["replicas"]
                }
                assert ids["used"] not in listed, "a replica in use was listed as idle"
                if ids["never"] in listed and listed_at is None:
                    listed_at = time.monotonic() - started
                fleet.bring_up()  # the agent's heartbeat
                time.sleep(0.25)
            procs.terminate(routers[name][1], stop_signal)
            routers[name] = fleet.router("--router-id", name)
    finally:
        stop.set()
        sender.join()
    assert len(last_use) > 20 and failures == []
    if stop_signal == signal.SIGTERM:
        assert listed_at is not None, "the never-used replica was listed across the restarts"
    else:
        assert listed_at is None, "a bound was counted across a crash"


def test_a_frozen_control_plane_listed_first_costs_the_table_seconds_not_a_long_poll(
    procs, tmp_path
):
    """A server that takes connections and never answers (SIGSTOP, a black-holed route) is
    given up after one short watch, within a lease TTL and a second, not 40 s."""
    fleet = Fleet(procs, tmp_path)
    fleet.serve(chat=1)
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        first = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        router, _ = fleet.router(control_plane=f"{first},{fleet.url}")
        api = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
        assert api.chat.completions.create(model="chat", messages=[]).choices

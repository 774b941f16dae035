"""gpurouter following a real `gpuctl server`: routes in, activity out.

The test plays the node agent over the control plane's HTTP API (register, heartbeat with
replicas Ready at the sim engines' URLs), so that only the router and control plane are
under test here; the real agent has its own tests.
"""

import json
import threading
import time

import openai
import pytest

from tests.controlplane.conftest import make_node, spec
from tests.harness import call, control_plane, get, wait_until

pytestmark = pytest.mark.integration


class Fleet:
    def __init__(self, procs, tmp_path):
        self.procs = procs
        self.url, _ = control_plane(procs, tmp_path / "state.sqlite", None, "--tick", "0.2")
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

    def router(self):
        router, proc = self.procs.router("--control-plane", self.url, "--tick", "0.3")
        wait_until(lambda: len(activity(router)["watched"]) == len(self.ready), what="routes")
        return router, proc


def activity(router):
    return json.loads(get(router + "/activity")[1])


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

    procs.terminate(proc)
    wait_until(
        lambda: fleet.replicas()[embed["id"]]["idle_state"] == "unknown",
        timeout=15,
        what="no live router to mean unknown",
    )
    restarted = time.monotonic()
    router, _ = fleet.router()
    assert activity(router)["used"] == {}
    wait_until(
        lambda: fleet.replicas()[embed["id"]]["idle_state"] == "at_least",
        what="the restarted router's report",
    )
    bound = fleet.replicas()[embed["id"]]["idle_s"]
    watched_since_restart = time.monotonic() - restarted
    assert bound <= watched_since_restart + 1, "a restart makes nothing look idle"
    assert fleet.replicas()[embed["id"]]["age_s"] > watched_since_restart + 5
    assert fleet.replicas()[chat["id"]]["idle_state"] == "exact"


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
    for replicas in (4, 1, 3, 2):
        call("POST", fleet.url + "/v1/models/chat/scale", {"replicas": replicas})
        for _ in range(5):
            time.sleep(0.1)
            fleet.bring_up()
        wait_until(lambda n=replicas: len(activity(router)["watched"]) == n, what="new routes")
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

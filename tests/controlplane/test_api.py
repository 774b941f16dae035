"""`gpuctl server` as a real process: what it accepts, what it refuses, what survives kill -9."""

import signal
import threading
import time
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.controlplane.conftest import make_node, spec
from tests.harness import call, control_plane, wait_until

pytestmark = pytest.mark.integration
TOKENS = {
    "admin": "adm-secret",
    "agent": "agt-secret",
    "router": "rtr-secret",
    "viewer": "vwr-secret",
}


@pytest.fixture
def server(procs, tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(TOKENS))
    url, proc = control_plane(procs, tmp_path / "state.sqlite", tokens)
    return url, proc, tokens


def test_refusals_leave_the_state_intact(server):
    url, _, _ = server
    assert call("POST", url + "/v1/models", spec(), token=TOKENS["admin"])[0] == 201
    before = call("GET", url + "/v1/models", token=TOKENS["viewer"])[1]
    refusals = [
        (("POST", url + "/v1/models", spec(name="other")), None, 401),
        (("POST", url + "/v1/models", spec(name="other")), TOKENS["router"], 403),
        (("POST", url + "/v1/models", spec(name="other")), TOKENS["viewer"], 403),
        (("POST", url + "/v1/models", spec(name="other")), "not-a-token", 401),
        (("POST", url + "/v1/models", {**spec(), "replicas": -2}), TOKENS["admin"], 400),
        (("POST", url + "/v1/models", {**spec(), "command": "vllm serve"}), TOKENS["admin"], 400),
        (("POST", url + "/v1/models", {**spec(), "bogus": 1}), TOKENS["admin"], 400),
        (("POST", url + "/v1/models", b"{oops"), TOKENS["admin"], 400),
        (("POST", url + "/v1/models", {**spec(replicas=3), "generation": 7}), TOKENS["admin"], 409),
        (("DELETE", url + "/v1/models/nope"), TOKENS["admin"], 404),
        (("POST", url + "/v1/models/nope/scale", {"replicas": 2}), TOKENS["admin"], 404),
        (("POST", url + "/v1/models/llama/scale", {"replicas": "x"}), TOKENS["admin"], 400),
        (("POST", url + "/v1/nodes/nope/cordon"), TOKENS["admin"], 404),
        (("POST", url + "/v1/nodes", {"name": "n1"}), TOKENS["agent"], 400),
        (("POST", url + "/v1/nodes", make_node("n1")), TOKENS["router"], 403),
        (("POST", url + "/v1/activity", {"router": "r"}), TOKENS["router"], 400),
        (("POST", url + "/v1/activity", {"router": "r"}), TOKENS["agent"], 403),
        (("GET", url + "/v1/routes"), None, 401),
        (("GET", url + "/v1/summary?idle_after=soon"), TOKENS["viewer"], 400),
    ]
    for (method, target, *body), token, status in refusals:
        got, answer = call(method, target, body[0] if body else None, token=token)
        assert got == status, (target, body, answer)
        assert answer["error"]["message"], answer
    bad_field = call("POST", url + "/v1/models", {**spec(), "replicas": -2}, token=TOKENS["admin"])[
        1
    ]
    assert bad_field["error"]["param"] == "replicas"
    assert call("GET", url + "/v1/models", token=TOKENS["viewer"])[1] == before
    assert call("GET", url + "/v1/nodes", token=TOKENS["viewer"])[1]["items"] == []


def test_apply_is_idempotent_and_generations_guard_stale_writes(server):
    url, _, _ = server
    status, first = call("POST", url + "/v1/models", spec(), token=TOKENS["admin"])
    assert status == 201 and first["spec"]["generation"] == 1
    assert (
        call("POST", url + "/v1/models", spec(), token=TOKENS["admin"])[1]["result"] == "unchanged"
    )
    changed = call(
        "POST", url + "/v1/models", {**spec(replicas=2), "generation": 1}, token=TOKENS["admin"]
    )[1]
    assert changed["spec"]["generation"] == 2
    stale = call(
        "POST", url + "/v1/models", {**spec(replicas=3), "generation": 1}, token=TOKENS["admin"]
    )
    assert stale[0] == 409
    assert call("GET", url + "/v1/models/llama", token=TOKENS["viewer"])[1]["desired"] == 2


def test_agent_flow_routes_and_activity(server):
    url, _, _ = server
    status, registered = call(
        "POST", url + "/v1/nodes", make_node("n1", gpus=2), token=TOKENS["agent"]
    )
    assert status == 201
    n1 = registered["credential"]  # the node's own, for its heartbeats from here on
    call("POST", url + "/v1/models", spec(), token=TOKENS["admin"])
    version = call("GET", url + "/v1/routes", token=TOKENS["router"])[1]["version"]
    (assignment,) = wait_until(
        lambda: call("POST", url + "/v1/nodes/n1/heartbeat", {"replicas": {}}, token=n1)[1][
            "assignments"
        ],
        what="the assignment, once the reconciler placed the replica",
    )
    assert assignment["command"][:2] == ["gpuctl", "sim-engine"] and assignment["gpus"] == [0]
    call(
        "POST",
        url + "/v1/nodes/n1/heartbeat",
        {"replicas": {assignment["replica"]: {"state": "Ready", "url": "http://127.0.0.1:1"}}},
        token=n1,
    )
    routes = call("GET", f"{url}/v1/routes?after={version}&wait=5", token=TOKENS["router"])[1]
    assert routes["routes"] == {
        "llama": [{"id": assignment["replica"], "url": "http://127.0.0.1:1"}]
    }
    report = {"router": "r1", "uptime_s": 30, "used": {}, "watched": {assignment["replica"]: 30}}
    assert call("POST", url + "/v1/activity", report, token=TOKENS["router"])[0] == 200
    (row,) = call("GET", url + "/v1/replicas", token=TOKENS["viewer"])[1]["items"]
    assert row["idle_state"] == "at_least" and row["idle_s"] >= 30
    summary = call("GET", url + "/v1/summary", token=TOKENS["viewer"])[1]
    assert summary["capacity"]["H100-80GB"] == {
        "used": 1,
        "free": 1,
        "unavailable": 0,
        "unhealthy": 0,
        "total": 2,
    }
    call(
        "POST",
        url + "/v1/nodes/n1/heartbeat",
        {"gpus": [{"index": 1, "healthy": False, "reason": "uncorrectable ECC"}]},
        token=n1,
    )
    summary = call("GET", url + "/v1/summary", token=TOKENS["viewer"])[1]
    assert summary["capacity"]["H100-80GB"]["free"] == 0
    assert summary["capacity"]["H100-80GB"]["unhealthy"] == 1
    assert summary["unhealthy_gpus"] == [{"node": "n1", "index": 1, "reason": "uncorrectable ECC"}]


def test_nothing_accepted_is_lost_to_kill_9(procs, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("one-token\n")
    state = tmp_path / "state.sqlite"
    url, proc = control_plane(procs, state, tokens)
    call("POST", url + "/v1/nodes", make_node("n1"), token="one-token")
    for i in range(5):
        assert call("POST", url + "/v1/models", spec(name=f"m{i}"), token="one-token")[0] == 201
    call("POST", url + "/v1/nodes/n1/cordon", token="one-token")
    # Placement is the reconciler's, a moment after each apply.
    replicas = wait_until(
        lambda: (
            len(r := call("GET", url + "/v1/replicas", token="one-token")[1]["items"]) == 5 and r
        ),
        what="a replica of each model",
    )
    procs.terminate(proc, signal.SIGKILL)
    url, _ = control_plane(procs, state, tokens)
    assert [m["name"] for m in call("GET", url + "/v1/models", token="one-token")[1]["items"]] == [
        f"m{i}" for i in range(5)
    ]
    (node,) = call("GET", url + "/v1/nodes", token="one-token")[1]["items"]
    assert node["schedulable"] == "cordoned"
    assert {r["id"] for r in call("GET", url + "/v1/replicas", token="one-token")[1]["items"]} == {
        r["id"] for r in replicas
    }


def test_an_acknowledged_goodbye_survives_kill_9(procs, tmp_path):
    """A router's last report of a clean stop is stored before it is answered: lost, the
    router would stay silent for good, its replicas unknown until an operator forgot it."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(TOKENS))
    state = tmp_path / "state.sqlite"
    url, proc = control_plane(procs, state, tokens)
    report = {"router": "edge-1", "incarnation": "i1", "uptime_s": 5, "used": {}, "watched": {}}
    assert call("POST", url + "/v1/activity", report, token=TOKENS["router"])[0] == 200
    goodbye = {**report, "uptime_s": 6, "goodbye": True}
    assert call("POST", url + "/v1/activity", goodbye, token=TOKENS["router"])[0] == 200
    procs.terminate(proc, signal.SIGKILL)
    url, _ = control_plane(procs, state, tokens)
    (router,) = call("GET", url + "/v1/routers", token=TOKENS["viewer"])[1]["items"]
    assert (router["id"], router["state"]) == ("edge-1", "gone")


def test_metrics_are_families_a_dashboard_can_use(server):
    url, _, _ = server
    admin = TOKENS["admin"]
    call("POST", url + "/v1/nodes", make_node("n1", gpus=2), token=TOKENS["agent"])
    call("POST", url + "/v1/nodes", make_node("n2", gpus=2), token=TOKENS["agent"])
    call("POST", url + "/v1/nodes/n2/cordon", token=admin)
    call("POST", url + "/v1/models", spec(name="fits", gpus_per_replica=2), token=admin)
    call("POST", url + "/v1/models", spec(name="big", gpus_per_replica=4, replicas=2), token=admin)

    def scrape():
        with urllib.request.urlopen(url + "/metrics") as resp:
            text = resp.read().decode()
        return {
            f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
            for f in text_string_to_metric_families(text)
        }

    families = wait_until(
        lambda: (
            (m := scrape())["gpufleet_model_replicas"].get(
                (("model", "big"), ("state", "unplaceable"))
            )
            == 2
            and m
        ),
        what="the placement to be tried",
    )
    replicas = families["gpufleet_model_replicas"]
    assert replicas[(("model", "fits"), ("state", "desired"))] == 1
    assert replicas[(("model", "fits"), ("state", "unplaceable"))] == 0
    assert replicas[(("model", "big"), ("state", "ready"))] == 0
    nodes = families["gpufleet_nodes"]
    assert nodes[(("state", "ready"),)] == 2 and nodes[(("state", "cordoned"),)] == 1
    gpus = families["gpufleet_gpus"]
    assert gpus[(("gpu_class", "H100-80GB"), ("state", "unavailable"))] == 2
    assert gpus[(("gpu_class", "H100-80GB"), ("state", "used"))] == 2
    assert families["gpufleet_model_idle_gpus"][(("model", "fits"),)] == 0


def test_lists_page_with_limit_and_continue_and_refuse_a_bad_page(server):
    url, _, _ = server
    for i in range(5):
        assert call("POST", url + "/v1/nodes", make_node(f"n{i}"), token=TOKENS["agent"])[0] == 201
    whole = call("GET", url + "/v1/nodes", token=TOKENS["viewer"])[1]
    assert [n["name"] for n in whole["items"]] == [f"n{i}" for i in range(5)]
    assert "metadata" not in whole
    seen, token, pages = [], None, []
    while True:
        query = "?limit=2" + (f"&continue={token}" if token else "")
        status, answer = call("GET", url + "/v1/nodes" + query, token=TOKENS["viewer"])
        assert status == 200 and answer["kind"] == "NodeList"
        pages.append(len(answer["items"]))
        seen += answer["items"]
        token = answer.get("metadata", {}).get("continue")
        if token is None:
            break
        assert answer["metadata"]["remaining"] == 5 - len(seen)
    assert pages == [2, 2, 1] and seen == whole["items"]
    for query, field in [
        ("?limit=0", "limit"),
        ("?limit=x", "limit"),
        ("?continue=@@", "continue"),
    ]:
        status, answer = call("GET", url + "/v1/nodes" + query, token=TOKENS["viewer"])
        assert status == 400 and answer["error"]["param"] == field, answer
        status, answer = call("GET", url + "/v1/replicas" + query, token=TOKENS["viewer"])
        assert status == 400 and answer["error"]["param"] == field, answer
    assert call("GET", url + "/v1/nodes", token=TOKENS["viewer"])[1] == whole


def test_a_stopping_server_answers_the_routers_waiting_watches_at_once(server):
    url, proc, _ = server
    current = call("GET", url + "/v1/routes", token=TOKENS["router"])[1]["version"]
    answers = []

    def watch():
        target = f"{url}/v1/routes?after={current}&wait=60"
        answers.append(call("GET", target, token=TOKENS["router"], timeout=30))

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.5)  # the watch is waiting on the server
    proc.send_signal(signal.SIGTERM)
    watcher.join(timeout=30)
    # Cut after the drain deadline instead, the watch would end in a connection error.
    assert answers and answers[0][0] == 200 and answers[0][1]["version"] == current
    assert proc.wait(timeout=10) == 0


def test_a_bad_gpu_memory_is_refused_naming_the_field_and_nothing_changes(server):
    url, _, _ = server
    admin = TOKENS["admin"]
    assert call("POST", url + "/v1/nodes", make_node("n1", gpus=1), token=TOKENS["agent"])[0] in (
        200,
        201,
    )
    assert call("POST", url + "/v1/models", spec(gpu_memory="20GB"), token=admin)[0] == 201
    before = call("GET", url + "/v1/models", token=TOKENS["viewer"])[1]
    for size, words in [
        ("100GB", "more than a H100-80GB card holds (81559 MiB)"),
        (0, "must be positive"),
        (-5, "must not be negative"),
        ("-5GB", "a size such as 60GB"),
        ("plenty", "a size such as 60GB"),
        (True, "a size such as 60GB"),
    ]:
        status, answer = call(
            "POST", url + "/v1/models", spec(name="other", gpu_memory=size), token=admin
        )
        assert status == 400, (size, answer)
        assert answer["error"]["param"] == "gpu_memory" and words in answer["error"]["message"]
    assert call("GET", url + "/v1/models", token=TOKENS["viewer"])[1] == before

"""Who may call what, with a real `gpuctl server`: every route walked from the API's own table,
secrets never read back, a node's credential good for that node alone, TLS with a private CA."""

import json
import subprocess

import pytest
import yaml

from cli.tls import make_certificates
from controlplane.api.app import ROUTES
from controlplane.vocabulary.auth import NODE, PUBLIC
from tests.controlplane.conftest import make_node, spec
from tests.harness import BIN, call, control_plane, get, wait_until

pytestmark = pytest.mark.integration
TOKENS = {"admin": "adm-1", "viewer": "vwr-1", "router": "rtr-1", "agent": "agt-1"}
MARKER = "hf_SECRET_MARKER_4242"


@pytest.fixture
def server(procs, tmp_path):
    token_file = tmp_path / "tokens.yaml"
    token_file.write_text(yaml.safe_dump(TOKENS))
    url, _ = control_plane(procs, tmp_path / "state.sqlite", token_file)
    return url


def register(url, name, token=TOKENS["agent"]):
    status, answer = call("POST", url + "/v1/nodes", make_node(name, gpus=2), token=token)
    assert status == 201, answer
    return answer["credential"]


def concrete(path: str) -> str:
    return path.replace("{name}", "n1").replace("{id}", "edge-1").replace("{action}", "cordon")


def test_every_route_refuses_a_missing_token_and_a_wrong_role(server):
    n1, n2 = register(server, "n1"), register(server, "n2")
    walked = 0
    for method, path, _, needs in ROUTES:
        target = server + concrete(path)
        if PUBLIC in needs:
            assert get(target)[0] == 200, path
            continue
        for token in (None, "nobody-issued-this"):
            status, answer = call(method, target, {}, token=token)
            assert status == 401, (method, path, answer)
            assert "needs a token" in answer["error"]["message"]
        wrong = [TOKENS[r] for r in ("viewer", "router", "agent") if r not in needs]
        if NODE in needs:
            wrong.append(n2)  # another node's credential
        elif path != "/v1/nodes":
            wrong += [n1, n2]  # a node credential is for its node's own calls
        assert wrong, path
        for token in wrong:
            status, answer = call(method, target, {}, token=token)
            assert status == 403, (method, path, token, answer)
            assert "needs" in answer["error"]["message"], answer
        walked += 1
    assert walked >= 18, "every guarded route was walked"
    # What the refusals left: the two nodes, nothing else.
    nodes = call("GET", server + "/v1/nodes", token=TOKENS["viewer"])[1]["items"]
    assert [n["name"] for n in nodes] == ["n1", "n2"]
    assert call("GET", server + "/v1/models", token=TOKENS["viewer"])[1]["items"] == []


def test_a_node_credential_acts_for_its_node_alone_and_deleting_the_node_revokes_it(server):
    n1, n2 = register(server, "n1"), register(server, "n2")
    assert call("POST", server + "/v1/nodes/n1/heartbeat", {}, token=n1)[0] == 200
    assert call("GET", server + "/v1/nodes/n1/assignments", token=n1)[0] == 200
    for method, path in (
        ("POST", "/v1/nodes/n2/heartbeat"),
        ("GET", "/v1/nodes/n2/assignments"),
    ):
        status, answer = call(method, server + path, {}, token=n1)
        assert status == 403 and "node n2's own credential" in answer["error"]["message"]
    # Re-registering: as itself, yes; as another node, or with the bootstrap token, no.
    assert call("POST", server + "/v1/nodes", make_node("n1", gpus=2), token=n1)[0] == 201
    assert call("POST", server + "/v1/nodes", make_node("n2", gpus=2), token=n1)[0] == 403
    taken = call("POST", server + "/v1/nodes", make_node("n2", gpus=2), token=TOKENS["agent"])
    assert taken[0] == 403 and "its own credential" in taken[1]["error"]["message"]
    deleted = subprocess.run(
        [str(BIN / "gpuctl"), "--server", server, "--token", TOKENS["admin"], "nodes", "delete",
         "n1"],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert deleted.returncode == 0 and deleted.stdout == "node/n1 deleted\n", deleted.stderr
    status, answer = call("POST", server + "/v1/nodes/n1/heartbeat", {}, token=n1)
    assert status == 401, "a revoked credential is refused"
    assert call("POST", server + "/v1/nodes/n2/heartbeat", {}, token=n2)[0] == 200


def test_no_read_returns_an_env_value_and_a_read_back_spec_keeps_it(server, tmp_path):
    n1 = register(server, "n1")
    body = spec(
        name="llama",
        env={"HF_TOKEN": MARKER, "PLAIN": "x"},
        env_from={"API_KEY": {"agent_env": "LLAMA_KEY"}},
    )
    answers = [call("POST", server + "/v1/models", body, token=TOKENS["admin"])[1]]
    answers.append(call("POST", server + "/v1/models?dry_run=true", body, token=TOKENS["admin"])[1])
    answers.append(
        call("POST", server + "/v1/models/llama/scale", {"replicas": 1}, token=TOKENS["admin"])[1]
    )
    for method, path, _, needs in ROUTES:
        if method != "GET" or NODE in needs:
            continue
        for token in (TOKENS["viewer"], TOKENS["admin"], TOKENS["router"]):
            answers.append(get(server + concrete(path), _bearer(token))[1].decode())
    answers.append(get(server + "/v1/models/llama", _bearer(TOKENS["viewer"]))[1].decode())
    gpuctl = [str(BIN / "gpuctl"), "--server", server, "--token", TOKENS["admin"]]
    for args in (
        ["models", "llama", "-o", "json"],
        ["models", "llama", "-o", "yaml"],
        ["models", "-o", "yaml"],
        ["status", "-o", "json"],
        ["replicas", "-o", "json"],
    ):
        done = subprocess.run([*gpuctl, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        answers.append(done.stdout)
    text = "\n".join(a if isinstance(a, str) else json.dumps(a, default=str) for a in answers)
    assert MARKER not in text, "an env value was read back"
    assert "<redacted>" in text and "HF_TOKEN" in text, "keys are shown"
    # kubectl's habit: read it back as YAML, edit, apply. The secret is kept.
    shown = subprocess.run(
        [*gpuctl, "models", "llama", "-o", "yaml"], capture_output=True, text=True, timeout=30
    )
    edited = yaml.safe_load(shown.stdout)["spec"]
    edited["replicas"] = 2
    back = tmp_path / "edited.yaml"
    back.write_text(yaml.safe_dump(edited))
    applied = subprocess.run([*gpuctl, "apply", "-f", str(back)], capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    (given, *_) = call("POST", server + "/v1/nodes/n1/heartbeat", {}, token=n1)[1]["assignments"]
    assert given["env"] == {"HF_TOKEN": MARKER, "PLAIN": "x"}, "the node is handed the value"
    assert given["env_from"] == {"API_KEY": {"agent_env": "LLAMA_KEY"}}
    # A redacted value with nothing stored behind it is refused by name, and nothing changes.
    status, answer = call(
        "POST",
        server + "/v1/models",
        spec(name="other", env={"NEW": "<redacted>"}),
        token=TOKENS["admin"],
    )
    assert status == 400 and answer["error"]["param"] == "env.NEW"


def test_metrics_can_ask_for_a_token_of_their_own(procs, tmp_path):
    token_file = tmp_path / "tokens.yaml"
    token_file.write_text(yaml.safe_dump(TOKENS))
    url, _ = control_plane(
        procs, tmp_path / "state.sqlite", token_file, "--metrics-token", "prom-1"
    )
    assert get(url + "/metrics")[0] == 401
    assert get(url + "/metrics", _bearer("prom-1"))[0] == 200
    assert get(url + "/metrics", _bearer(TOKENS["viewer"]))[0] == 200
    assert get(url + "/metrics", _bearer(TOKENS["router"]))[0] == 403
    assert get(url + "/healthz")[0] == 200


def test_metrics_close_once_the_fleet_has_tenants_and_stay_closed(procs, tmp_path):
    """/metrics names tenants and their GPU-seconds: with no token to ask for, it answers
    nobody once a tenant exists, and a metrics token opens it again."""
    url, _ = control_plane(procs, tmp_path / "open.sqlite")
    assert get(url + "/metrics")[0] == 200, "no tenant: open, as before"
    assert call("POST", url + "/v1/tenants", {"name": "secret-team"})[0] == 201
    status, body = get(url + "/metrics")
    assert status == 401 and b"secret-team" not in body
    assert b"--metrics-token" in body, "the answer says how to read it"
    assert call("DELETE", url + "/v1/tenants/secret-team")[0] == 200
    assert get(url + "/metrics")[0] == 401, "deleting the last tenant opens nothing"
    assert call("GET", url + "/v1/tenants")[0] == 200, "the rest of the API is as it was"

    url, _ = control_plane(procs, tmp_path / "token.sqlite", None, "--metrics-token", "prom-1")
    assert call("POST", url + "/v1/tenants", {"name": "secret-team"})[0] == 201
    assert get(url + "/metrics")[0] == 401
    status, body = get(url + "/metrics", _bearer("prom-1"))
    assert status == 200 and b"gpufleet_" in body


def test_tls_with_a_private_ca_and_a_clear_refusal_without_it(procs, tmp_path):
    made = make_certificates(tmp_path / "tls")
    token_file = tmp_path / "tokens.yaml"
    token_file.write_text(yaml.safe_dump(TOKENS))
    url, _ = control_plane(
        procs,
        tmp_path / "state.sqlite",
        token_file,
        "--tls-cert",
        str(made.cert),
        "--tls-key",
        str(made.key),
    )
    https = url.replace("http://", "https://")
    gpuctl = [str(BIN / "gpuctl"), "--server", https, "--token", TOKENS["admin"]]
    env = {"GPUCTL_CONFIG": str(tmp_path / "none.yaml")}
    trusted = subprocess.run(
        [*gpuctl, "--ca-file", str(made.ca), "status", "-o", "json"],
        capture_output=True,
        text=True,
        env={**_env(), **env},
    )
    assert trusted.returncode == 0, trusted.stderr
    assert json.loads(trusted.stdout)["nodes"]["total"] == 0
    refused = subprocess.run(
        [*gpuctl, "status"], capture_output=True, text=True, env={**_env(), **env}
    )
    assert refused.returncode == 1
    assert "certificate this client does not trust" in refused.stderr
    assert "--ca-file" in refused.stderr


def _bearer(token):
    return {"Authorization": f"Bearer {token}"}


def _env():
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("GPUCTL_")}


def test_a_metrics_token_alone_guards_metrics_and_nothing_else(procs, tmp_path):
    url, _ = control_plane(procs, tmp_path / "state.sqlite", None, "--metrics-token", "prom-1")
    assert get(url + "/metrics")[0] == 401
    assert get(url + "/metrics", _bearer("prom-1"))[0] == 200
    assert call("GET", url + "/v1/models")[0] == 200, "the API stays open without a token file"
    assert call("POST", url + "/v1/models", spec(name="open"))[0] == 201
    assert [m["name"] for m in call("GET", url + "/v1/models")[1]["items"]] == ["open"]


def test_only_a_node_itself_reads_its_assignments_admin_included(server):
    n1 = register(server, "n1")
    body = spec(name="llama", env={"HF_TOKEN": MARKER})
    assert call("POST", server + "/v1/models", body, token=TOKENS["admin"])[0] == 201
    for method, path in (("GET", "/v1/nodes/n1/assignments"), ("POST", "/v1/nodes/n1/heartbeat")):
        status, answer = call(method, server + path, {}, token=TOKENS["admin"])
        assert status == 403, (path, answer)
        assert "node n1's own credential" in answer["error"]["message"]
        assert MARKER not in json.dumps(answer)
    # The node itself is handed the value, and the refusals changed nothing.
    given = wait_until(
        lambda: call("GET", server + "/v1/nodes/n1/assignments", token=n1)[1]["assignments"]
    )
    assert [a["env"] for a in given] == [{"HF_TOKEN": MARKER}]


def test_the_router_role_calls_routes_activity_and_demand_and_reads_nothing_else(server):
    for path in ("/v1/models", "/v1/nodes", "/v1/replicas", "/v1/summary", "/v1/routers"):
        status, answer = call("GET", server + path, token=TOKENS["router"])
        assert status == 403 and "viewer" in answer["error"]["message"], (path, answer)
    assert call("GET", server + "/v1/routes", token=TOKENS["router"])[0] == 200


def test_a_demand_that_is_not_an_object_is_refused_and_changes_nothing(server):
    assert call("POST", server + "/v1/models", spec(name="m"), token=TOKENS["admin"])[0] == 201
    for body in (b"[1, 2]", b'"m"', b"3"):
        status, answer = call("POST", server + "/v1/demand", body, token=TOKENS["router"])
        assert status == 400, (body, answer)
        assert "expected a JSON object" in answer["error"]["message"]
    (model,) = call("GET", server + "/v1/models", token=TOKENS["viewer"])[1]["items"]
    assert model["name"] == "m"


def test_an_agent_may_bring_its_own_credential_and_only_its_digest_travels(server):
    from controlplane.vocabulary.auth import digest, new_credential

    token = new_credential()[0]
    body = {**make_node("n1", gpus=2), "credential_sha256": digest(token)}
    status, answer = call("POST", server + "/v1/nodes", body, token=TOKENS["agent"])
    assert status == 201 and answer["credential_accepted"] and "credential" not in answer
    assert call("POST", server + "/v1/nodes/n1/heartbeat", {}, token=token)[0] == 200
    # Registering again, as itself, after an answer that was lost: allowed.
    assert call("POST", server + "/v1/nodes", make_node("n1", gpus=2), token=token)[0] == 201
    for bad, status_wanted in (("abc", 400), (digest(token), 409)):
        body = {**make_node("n2", gpus=2), "credential_sha256": bad}
        status, answer = call("POST", server + "/v1/nodes", body, token=TOKENS["agent"])
        assert status == status_wanted, answer
    nodes = call("GET", server + "/v1/nodes", token=TOKENS["viewer"])[1]["items"]
    assert [n["name"] for n in nodes] == ["n1"], "the refusals registered nothing"

"""gpuctl through click's CliRunner against a real `gpuctl server` process."""

import json
import signal
import subprocess
import time

import pytest
import yaml
from click.testing import CliRunner

from cli.main import gpuctl
from tests.controlplane.conftest import make_node, spec
from tests.harness import BIN, call, control_plane, free_port, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def cp(procs, tmp_path, monkeypatch):
    tokens = tmp_path / "tokens"
    tokens.write_text("sekret\n")
    url, _ = control_plane(procs, tmp_path / "state.sqlite", tokens, "--tick", "0.2")
    monkeypatch.setenv("GPUCTL_CONFIG", str(tmp_path / "no-such-config.yaml"))
    monkeypatch.delenv("GPUCTL_SERVER", raising=False)
    monkeypatch.setenv("GPUCTL_TOKEN", "sekret")  # every call needs one
    return url


def run(*args, env=None, input=None):
    return CliRunner().invoke(gpuctl, list(args), env=env, input=input, catch_exceptions=False)


def test_apply_list_scale_delete(cp, tmp_path):
    specs = tmp_path / "models.yaml"
    specs.write_text(
        yaml.safe_dump_all([spec(name="llama", replicas=1), spec(name="qwen", gpus_per_replica=4)])
    )
    auth = ["--server", cp, "--token", "sekret"]
    result = run(*auth, "apply", "-f", str(specs))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["model/llama created", "model/qwen created"]
    assert run(*auth, "apply", "-f", str(specs)).output.splitlines()[0] == "model/llama unchanged"
    empty = json.loads(run(*auth, "nodes", "-o", "json").output)
    assert empty["items"] == []
    call("POST", cp + "/v1/nodes", make_node("gpu-1", gpus=2), token="sekret")
    assert run(*auth, "scale", "llama", "2").output == "model/llama scaled to 2\n"
    listed = run(*auth, "models", "--no-headers").output.splitlines()
    assert listed[0].split()[:4] == ["llama", "H100-80GB", "1", "0/2/2"]
    assert listed[1].split()[:5] == ["qwen", "H100-80GB", "4", "0/1/1", "Unplaceable"]
    wide = run(*auth, "models", "-o", "wide").output
    assert "needs 4 free H100-80GB GPUs on one node" in wide
    nodes = run(*auth, "nodes").output.splitlines()
    assert nodes[0].split()[:3] == ["NAME", "STATUS", "FABRIC"]
    assert nodes[1].split()[:2] == ["gpu-1", "Ready"]
    replicas = json.loads(run(*auth, "replicas", "-o", "json").output)["items"]
    assert {r["idle_state"] for r in replicas} == {"unknown"}
    table = run(*auth, "replicas").output.splitlines()
    assert all(line.split()[5] == "-" for line in table[1:]), "unknown shows as -"
    assert run(*auth, "cordon", "gpu-1").output == "node/gpu-1 cordoned\n"
    assert "SchedulingDisabled" in run(*auth, "nodes").output
    assert run(*auth, "delete", "qwen").output == "model/qwen deleted\n"
    status = json.loads(run(*auth, "status", "-o", "json").output)
    assert status["models"]["total"] == 1
    assert status["capacity"]["H100-80GB"]["total"] == 2


def test_errors_are_one_line_and_exit_1_usage_is_exit_2(cp, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec(replicas=-1)))
    result = run("--server", cp, "--token", "sekret", "apply", "-f", str(bad))
    assert result.exit_code == 1
    assert "replicas: must not be negative" in result.output
    assert len(result.output.strip().splitlines()) == 1
    unauthorised = run("--server", cp, "apply", "-f", str(bad), env={"GPUCTL_TOKEN": ""})
    assert unauthorised.exit_code == 1 and "401" in unauthorised.output
    missing = run("--server", cp, "--token", "sekret", "delete", "nope")
    assert missing.exit_code == 1 and "404: model nope not found" in missing.output
    down = run("--server", f"http://127.0.0.1:{free_port()}", "status")
    assert down.exit_code == 1 and "cannot reach the control plane" in down.output
    assert run("--server", cp, "scale", "llama", "-3").exit_code == 2
    assert run("--server", cp, "nodes", "-o", "xml").exit_code == 2
    assert run("--server", cp, "status", "-o", "name").exit_code == 2
    assert run("--server", cp, "status", "--idle-after", "soon").exit_code == 2
    assert json.loads(run("--server", cp, "models", "-o", "json").output)["items"] == []


def test_server_and_token_come_from_env_then_config_file(cp, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"server": cp, "token": "sekret"}))
    monkeypatch.setenv("GPUCTL_CONFIG", str(config))
    assert run("scale", "nope", "1").output.startswith("Error: 404")
    result = run("status", env={"GPUCTL_SERVER": f"http://127.0.0.1:{free_port()}"})
    assert "cannot reach" in result.output, "the environment wins over the config file"
    flagged = run(
        "--server", f"http://127.0.0.1:{free_port()}", "status", env={"GPUCTL_SERVER": cp}
    )
    assert "cannot reach" in flagged.output, "a flag wins over the environment"


def test_mutations_answer_json_too(cp, tmp_path):
    specs = tmp_path / "m.yaml"
    specs.write_text(yaml.safe_dump(spec(name="llama")))
    auth = ["--server", cp, "--token", "sekret"]
    applied = json.loads(run(*auth, "apply", "-f", str(specs), "-o", "json").output)
    assert applied["items"][0]["result"] == "created"
    scaled = json.loads(run(*auth, "scale", "llama", "3", "-o", "json").output)
    assert scaled["spec"]["replicas"] == 3
    call("POST", cp + "/v1/nodes", make_node("gpu-1", gpus=2), token="sekret")
    drained = json.loads(run(*auth, "drain", "gpu-1", "-o", "json").output)
    assert drained["schedulable"] == "draining"
    deleted = json.loads(run(*auth, "delete", "llama", "-o", "json").output)
    assert deleted["result"] == "deleted"


def test_one_output_vocabulary_on_every_command(cp, tmp_path):
    specs = tmp_path / "m.yaml"
    specs.write_text(yaml.safe_dump_all([spec(name="llama"), spec(name="qwen")]))
    auth = ["--server", cp, "--token", "sekret"]
    assert run(*auth, "apply", "-f", str(specs), "-o", "name").output.split() == [
        "model/llama",
        "model/qwen",
    ]
    call("POST", cp + "/v1/nodes", make_node("gpu-1", gpus=2), token="sekret")
    assert run(*auth, "nodes", "-o", "name").output == "node/gpu-1\n"
    assert run(*auth, "models", "-o", "name").output.split() == ["model/llama", "model/qwen"]
    listed = yaml.safe_load(run(*auth, "models", "-o", "yaml").output)
    assert [m["name"] for m in listed["items"]] == ["llama", "qwen"]
    status = yaml.safe_load(run(*auth, "status", "-o", "yaml").output)
    assert status["capacity"]["H100-80GB"]["total"] == 2
    assert run(*auth, "cordon", "gpu-1", "-o", "name").output == "node/gpu-1\n"
    assert (
        yaml.safe_load(run(*auth, "scale", "qwen", "0", "-o", "yaml").output)["spec"]["replicas"]
        == 0
    )
    assert run(*auth, "routers", "-o", "json").output.strip().startswith("{")
    version = run("--version")
    assert version.exit_code == 0 and version.output.startswith("gpuctl, version ")


def write(tmp_path, body):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_apply_dry_run_checks_on_the_server_and_stores_nothing(cp, tmp_path):
    auth = ["--server", cp, "--token", "sekret"]
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(spec(name="llama")))
    bad.write_text(yaml.safe_dump(spec(name="llama", gpus_per_replica=0)))
    result = run(*auth, "apply", "-f", str(good), "--dry-run")
    assert result.output.splitlines() == [
        "model/llama created (dry run)",
        "  keeps 1 replica(s); idleness stops none",
        "  priority 0: with requests waiting and no free GPUs, it may take the GPUs of idle"
        " replicas of models of priority 0 or lower",
        "  none of its replicas is ever taken for another model (min_replicas)",
    ]
    refused = run(*auth, "apply", "-f", str(bad), "--dry-run")
    assert refused.exit_code == 1 and "gpus_per_replica" in refused.output
    swappable = tmp_path / "swappable.yaml"
    swappable.write_text(
        yaml.safe_dump(spec(name="llama", min_replicas=0, priority=-2, scale_to_zero_after="10m"))
    )
    explained = run(*auth, "apply", "-f", str(swappable), "--dry-run").output
    assert "scales from 1 down to 0 replica(s) after 10m unused" in explained
    assert "min_residency 2m (the server's default): once Ready" in explained
    assert "priority -2 or higher for 2m" in explained
    sleepy = spec(
        name="llama", min_replicas=0, engine="vllm", sleep={"level": 1, "after": "5m"},
        max_adapters=4,
    )  # fmt: skip
    explained = run(*auth, "apply", "-f", str(write(tmp_path, sleepy)), "--dry-run").output
    assert "sleeps at level 1 (its weights kept in host memory) after 5m unused" in explained
    assert "within 2m or it is restarted cold" in explained
    assert "each replica holds up to 4 LoRA adapter(s)" in explained
    for field, value in (("priority", "high"), ("priority", True), ("min_residency", "-1s")):
        refused = run(*auth, "apply", "-f", str(write(tmp_path, spec(**{field: value}))))
        assert refused.exit_code == 1 and field in refused.output, (field, refused.output)
    assert call("GET", cp + "/v1/models", token="sekret")[1]["items"] == []


def test_models_name_shows_replicas_and_events(cp, tmp_path):
    auth = ["--server", cp, "--token", "sekret"]
    call("POST", cp + "/v1/nodes", make_node("gpu-1", gpus=1), token="sekret")
    specs = tmp_path / "m.yaml"
    specs.write_text(yaml.safe_dump(spec(name="llama", replicas=2)))
    run(*auth, "apply", "-f", str(specs))
    wait_until(
        lambda: call("GET", cp + "/v1/models/llama", token="sekret")[1]["reason"], what="a reason"
    )
    text = run(*auth, "models", "llama").output
    assert text.splitlines()[0].split() == ["NAME", "llama"]
    assert "REPLICAS" in text and "gpu-1" in text
    events = text.split("EVENTS", 1)[1]
    assert "spec created (generation 1)" in events
    assert "placed on gpu-1" in events and "cannot be placed" in events
    missing = run(*auth, "models", "nope")
    assert missing.exit_code == 1 and "404" in missing.output


@pytest.mark.parametrize("mode, expect", [("always", True), ("never", False), ("auto", False)])
def test_colour_follows_the_flag_and_no_color_wins(cp, mode, expect, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = run("--server", cp, "--color", mode, "status")
    assert ("\x1b[" in coloured.output) is expect  # auto: CliRunner is no terminal
    plain = run("--server", cp, "--color", "always", "status", env={"NO_COLOR": "1"})
    assert "\x1b[" not in plain.output


def test_watch_shows_the_screen_again_until_interrupted(cp):
    watcher = subprocess.Popen(
        [str(BIN / "gpuctl"), "--server", cp, "status", "--watch", "--interval", "0.3"],
        stdout=subprocess.PIPE,
        text=True,
        # Ctrl-C as on a terminal: a test run started in the background inherits SIGINT
        # ignored, and Python then leaves it ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        time.sleep(2.5)
    finally:
        watcher.send_signal(signal.SIGINT)
        try:
            output, _ = watcher.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            watcher.kill()
            raise
    assert watcher.returncode == 0
    assert output.count("FLEET") >= 3


def test_scale_on_an_autoscaled_model_sets_the_start_or_refuses_outside_the_bounds(cp, tmp_path):
    auth = ["--server", cp, "--token", "sekret"]
    body = spec(name="busy", replicas=2, min_replicas=1, max_replicas=4, target_in_flight=4)
    explained = run(*auth, "apply", "-f", str(write(tmp_path, body)), "--dry-run").output
    assert "autoscales between 1 and 4 replica(s), starting at 2: ceil(load / 4)" in explained
    run(*auth, "apply", "-f", str(write(tmp_path, body)))
    moved = run(*auth, "scale", "busy", "3")
    assert moved.output == (
        "model/busy scaled to 3 (the point it starts from: load moves it between 1 and 4)\n"
    )
    refused = run(*auth, "scale", "busy", "5")
    assert refused.exit_code == 1
    assert "autoscales between min_replicas 1 and max_replicas 4" in refused.output
    kept = call("GET", cp + "/v1/models/busy", token="sekret")[1]["spec"]
    assert kept["replicas"] == 3, "a refused scale changes nothing"
    for bad, field in (
        ({"max_replicas": 1}, "max_replicas"),
        ({"target_in_flight": 0}, "target_in_flight"),
        ({"target_in_flight": None, "max_replicas": 4}, "target_in_flight"),
        ({"scale_down_delay": "later"}, "scale_down_delay"),
    ):
        refused = run(*auth, "apply", "-f", str(write(tmp_path, {**body, **bad})))
        assert refused.exit_code == 1 and field in refused.output, (bad, refused.output)
    assert call("GET", cp + "/v1/models/busy", token="sekret")[1]["spec"]["max_replicas"] == 4


def test_a_list_is_fetched_a_chunk_at_a_time_and_comes_whole(cp):
    auth = ["--server", cp, "--token", "sekret"]
    for name in ("gpu-3", "gpu-1", "gpu-2"):
        call("POST", cp + "/v1/nodes", make_node(name, gpus=2), token="sekret")
    paged = json.loads(run(*auth, "nodes", "-o", "json", "--chunk-size", "1").output)
    assert [n["name"] for n in paged["items"]] == ["gpu-1", "gpu-2", "gpu-3"]
    assert "metadata" not in paged
    assert paged == json.loads(run(*auth, "nodes", "-o", "json", "--chunk-size", "0").output)
    table = run(*auth, "nodes", "--chunk-size", "2", "--no-headers").output.splitlines()
    assert [line.split()[0] for line in table] == ["gpu-1", "gpu-2", "gpu-3"]
    assert run(*auth, "nodes", "--chunk-size", "-1").exit_code == 2


def test_tenants_apply_keys_and_usage(cp, tmp_path):
    auth = ["--server", cp, "--token", "sekret"]
    doc = tmp_path / "tenants.yaml"
    doc.write_text(
        yaml.safe_dump_all(
            [
                {"kind": "tenant", "name": "team-a", "requests_per_minute": 600, "weight": 3},
                {"kind": "tenant", "name": "team-b", "models": ["llama*"]},
            ]
        )
    )
    applied = run(*auth, "apply", "-f", str(doc))
    assert applied.exit_code == 0, applied.output
    assert "tenant/team-a created" in applied.output
    made = run(*auth, "tenants", "create-key", "team-a")
    assert made.exit_code == 0, made.output
    key = made.output.split()[0]
    assert key.startswith("gfk_")
    listed = run(*auth, "tenants", "-o", "wide")
    assert "team-a" in listed.output and "600" in listed.output and "llama*" in listed.output
    assert key not in listed.output and key not in run(*auth, "tenants", "-o", "json").output
    key_id = json.loads(run(*auth, "tenants", "-o", "json").output)["items"][0]["keys"][0]["id"]
    assert run(*auth, "tenants", "revoke-key", key_id).exit_code == 0
    again = run(*auth, "tenants", "revoke-key", key_id)
    assert again.exit_code == 1 and "not found" in again.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"kind": "tenant", "name": "team-c", "max_in_flight": -2}))
    refused = run(*auth, "apply", "-f", str(bad))
    assert refused.exit_code == 1 and "max_in_flight" in refused.output
    assert run(*auth, "delete", "tenant/team-b").exit_code == 0
    names = json.loads(run(*auth, "tenants", "-o", "json").output)["items"]
    assert [t["name"] for t in names] == ["team-a"]
    usage = run(*auth, "usage", "--since", "30m", "-o", "json")
    assert usage.exit_code == 0 and json.loads(usage.output)["items"] == []
    assert run(*auth, "usage", "--since", "2d").exit_code == 1

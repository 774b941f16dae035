"""The router's OpenAI surface and its own endpoints, against real processes: multipart,
stored responses, served adapters, metrics no client can poison, routes checked on arrival."""

import json
import logging
import signal
import subprocess
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.control.leader import ControlPlanes
from router.control.routes import RouteWatcher
from tests.harness import BIN, free_port, get, post, wait_until

pytestmark = pytest.mark.integration
CHAT = [{"role": "user", "content": "hello"}]


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)


def test_audio_transcription_is_routed_by_its_form_field(procs):
    engine = procs.engine("whisper")
    router, _ = procs.router(f"--backend=whisper={engine}")
    text = client(router).audio.transcriptions.create(
        model="whisper", file=("hello.wav", b"RIFF" + b"\0" * 96, "audio/wav")
    )
    assert text.text == "100 bytes of audio heard"
    form = b'--xyz\r\ncontent-disposition: form-data; name="file"\r\n\r\nabc\r\n--xyz--\r\n'
    status, _, raw = post(
        router + "/v1/audio/transcriptions",
        form,
        {"Content-Type": "multipart/form-data; boundary=xyz"},
    )
    assert status == 400 and json.loads(raw)["error"]["param"] == "model"


def test_stored_responses_are_found_on_the_replica_that_holds_them(procs):
    engines = [procs.engine("m") for _ in range(3)]
    router, _ = procs.router(*(f"--backend=m={e}" for e in engines))
    api = client(router)
    created = [api.responses.create(model="m", input="hi") for _ in range(3)]
    for response in created:
        got = api.responses.retrieve(response.id, extra_query={"model": "m"})
        assert got.id == response.id
    status, raw = get(router + f"/v1/responses/{created[0].id}")
    assert status == 400
    assert "?model=NAME" in json.loads(raw)["error"]["message"]
    status, raw = get(router + "/v1/responses/resp_none", {"X-Gpufleet-Model": "m"})
    assert status == 404
    api.responses.delete(created[1].id, extra_headers={"X-Gpufleet-Model": "m"})
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(created[1].id, extra_query={"model": "m"})


def test_models_lists_the_adapters_replicas_serve_and_routes_them(procs):
    engine = procs.engine("base", adapter="base-sql")
    router, _ = procs.router(f"--backend=base={engine}")
    api = client(router)

    def listed():
        return {m.id: getattr(m, "parent", None) for m in api.models.list()}

    assert wait_until(lambda: "base-sql" in listed(), what="the adapter in /v1/models")
    assert listed() == {"base": None, "base-sql": "base"}
    answer = api.chat.completions.create(model="base-sql", messages=CHAT)
    assert answer.model == "base-sql"
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="other", messages=CHAT)


def test_metrics_take_only_routed_names_as_labels(procs):
    engine = procs.engine("m")
    router, _ = procs.router(f"--backend=m={engine}")
    hostile = 'evil"} 1\nfake_metric{a="'
    for name in [hostile, "a\\b", *(f"unknown-{i}" for i in range(300))]:
        body = json.dumps({"model": name, "prompt": "x"}).encode()
        assert post(router + "/v1/completions", body)[0] == 404
    assert post(router + "/v1/completions", b'{"model": "m", "prompt": "x"}')[0] == 200
    status, text = get(router + "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert "fake_metric" not in families
    requests = {
        (s.labels["model"], s.labels["status"]): s.value
        for s in families["gpurouter_requests"].samples
    }
    assert requests == {("(unrouted)", "404"): 302, ("m", "200"): 1}
    assert len(text.decode().splitlines()) < 200


def test_workers_answer_metrics_for_the_whole_router(procs):
    engine = procs.engine("m")
    router, _ = procs.router(f"--backend=m={engine}", "--workers", "2", "--tick", "0.2")
    for _ in range(40):
        assert post(router + "/v1/completions", b'{"model": "m", "prompt": "x"}')[0] == 200

    def counted():
        text = get(router + "/metrics")[1].decode()
        family = next(
            f for f in text_string_to_metric_families(text) if f.name == "gpurouter_requests"
        )
        return sum(s.value for s in family.samples)

    wait_until(lambda: counted() == 40, what="both workers' counts in one scrape")
    assert [counted() for _ in range(10)] == [40] * 10


def test_activity_needs_the_api_key_when_keys_are_set(procs, tmp_path):
    engine = procs.engine("m")
    keys = tmp_path / "keys"
    keys.write_text("sk-good\n")
    router, _ = procs.router(f"--backend=m={engine}", "--api-keys-file", str(keys))
    assert get(router + "/activity")[0] == 401
    status, raw = get(router + "/activity", {"Authorization": "Bearer sk-good"})
    assert status == 200 and "m" not in json.loads(raw)["used"]
    assert get(router + "/healthz")[0] == 200


@pytest.mark.parametrize(
    "flag",
    ["--backend=m=http://127.0.0.1:notaport", "--backend=m=http://:8000", "--backend=m=ftp://x"],
)
def test_a_bad_backend_url_is_refused_at_start(flag):
    done = subprocess.run(
        [str(BIN / "gpurouter"), "--listen", f"127.0.0.1:{free_port()}", flag],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "bad route" in done.stderr or "--backend takes" in done.stderr


def test_a_routes_file_with_a_bad_url_keeps_the_last_good_table(procs, tmp_path):
    engine = procs.engine("a")
    routes = tmp_path / "routes.yaml"
    routes.write_text(f"a: [{engine}]\n")
    router, proc = procs.router("--routes", str(routes))
    routes.write_text("a: ['http://127.0.0.1:99999']\n")
    proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "routes not reloaded" in procs.log(proc), what="the refusal")
    assert "99999" in procs.log(proc)
    assert post(router + "/v1/completions", b'{"model": "a"}')[0] == 200


def test_a_bad_url_from_the_control_plane_is_left_out_with_a_log_line(caplog, fastpath):
    table = fastpath.EndpointTable()
    watcher = RouteWatcher(None, ControlPlanes("http://127.0.0.1:1"), table, None)
    routes = {
        "m": [
            {"id": "good", "url": "http://127.0.0.1:9000"},
            {"id": "bad", "url": "http://127.0.0.1:port"},
        ]
    }
    with caplog.at_level(logging.ERROR, logger="gpurouter.routes"):
        watcher.apply({"version": 7, "routes": routes})
    assert [endpoint_id for _, endpoint_id, _ in table.endpoints("m")] == ["good"]
    assert table.version == 7 and "endpoint 'bad'" in caplog.text


@pytest.mark.parametrize("static", [["--backend", "m=http://127.0.0.1:1"], ["--routes", None]])
def test_static_routes_beside_a_control_plane_are_a_usage_error(tmp_path, static):
    if static[1] is None:
        static[1] = str(tmp_path / "routes.yaml")
        Path(static[1]).write_text("m: [http://127.0.0.1:1]\n")
    done = subprocess.run(
        [
            str(BIN / "gpurouter"), "--listen", f"127.0.0.1:{free_port()}",
            "--control-plane", "http://127.0.0.1:1", *static,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "without --control-plane" in done.stderr, done.stderr


def test_a_routes_file_that_is_not_yaml_is_a_usage_error(tmp_path):
    routes = tmp_path / "routes.yaml"
    routes.write_text("m: [http://127.0.0.1:1\n  oops: {")
    done = subprocess.run(
        [str(BIN / "gpurouter"), "--listen", f"127.0.0.1:{free_port()}", "--routes", str(routes)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "not valid YAML" in done.stderr
    assert "Traceback" not in done.stderr

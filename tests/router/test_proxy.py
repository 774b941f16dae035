"""gpurouter in front of real sim engines, driven with the official openai client and raw HTTP."""

import json
import os
import signal
import socket
import threading
import time

import openai
import pytest

from tests.harness import free_port, get, post, wait_until

pytestmark = pytest.mark.integration
CHAT = [{"role": "user", "content": "hello"}]


def client(base: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=base + "/v1",
        api_key=kw.pop("api_key", "none"),
        max_retries=0,
        timeout=kw.pop("timeout", 10),
        **kw,
    )


def engine_metric(engine: str, name: str) -> float:
    _, text = get(engine + "/metrics")
    for line in text.decode().splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


def router_metric(router: str, prefix: str) -> float:
    _, text = get(router + "/metrics")
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.decode().splitlines()
        if line.startswith(prefix)
    )


def test_openai_client_plain_and_streaming(procs):
    engine = procs.engine("llama", output_tokens=5)
    router, _ = procs.router("--backend", f"llama={engine}")
    api = client(router)
    answer = api.chat.completions.create(model="llama", messages=CHAT)
    assert answer.choices[0].message.content.startswith("the fleet")
    assert answer.usage.completion_tokens == 5
    chunks = list(
        api.chat.completions.create(
            model="llama", messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == ["the", "fleet", "serves", "many", "models"]
    assert chunks[-1].usage.completion_tokens == 5
    completion = api.completions.create(model="llama", prompt="hi", max_tokens=2)
    assert completion.choices[0].text == "the fleet"
    embedding = api.embeddings.create(model="llama", input=["a", "b"])
    assert len(embedding.data) == 2
    assert [m.id for m in api.models.list()] == ["llama"]


def test_request_id_is_kept_or_generated(procs):
    engine = procs.engine("m")
    router, _ = procs.router("--backend", f"m={engine}")
    body = b'{"model": "m", "messages": []}'
    status, headers, _ = post(router + "/v1/chat/completions", body, {"X-Request-Id": "abc-1"})
    assert status == 200 and headers["x-request-id"] == "abc-1"
    _, first, _ = post(router + "/v1/chat/completions", body)
    _, second, _ = post(router + "/v1/chat/completions", body)
    assert first["x-request-id"] != second["x-request-id"]


def test_least_loaded_spreads_concurrent_requests(procs):
    engines = [procs.engine("m", ttft=0.4) for _ in range(2)]
    router, _ = procs.router(*[f"--backend=m={e}" for e in engines], "--affinity", "off")
    api = client(router)
    threads = [
        threading.Thread(
            target=api.chat.completions.create, kwargs={"model": "m", "messages": CHAT}
        )
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = [engine_metric(e, "vllm:request_success_total") for e in engines]
    assert counts == [3, 3]


def test_failover_when_a_replica_is_down(procs):
    live = procs.engine("m")
    dead = f"http://127.0.0.1:{free_port()}"
    # Least in flight rotates over both, so some requests meet the dead one first.
    router, _ = procs.router(f"--backend=m={dead}", f"--backend=m={live}", "--affinity", "off")
    api = client(router)
    for _ in range(6):
        assert api.chat.completions.create(model="m", messages=CHAT).choices
    assert router_metric(router, "gpurouter_retries_total") >= 1
    assert router_metric(router, 'gpurouter_requests_total{model="m",status="200"}') == 6


def test_replica_killed_mid_stream_ends_with_an_error_event(procs):
    engine = procs.engine("m", close_after_tokens=2, output_tokens=10)
    router, _ = procs.router(f"--backend=m={engine}")
    api = client(router)
    seen = []
    with pytest.raises(openai.APIError, match="mid-answer"):
        for chunk in api.chat.completions.create(model="m", messages=CHAT, stream=True):
            seen.append(chunk.choices[0].delta.content)
    assert seen == ["the ", "fleet "]
    data = raw_stream(router, b'{"model":"m","stream":true}')
    assert b'"code":"upstream_disconnected"' in data and b"data: [DONE]" in data
    assert router_metric(router, "gpurouter_in_flight_requests") == 0


def test_client_disconnect_cancels_the_upstream_request(procs):
    engine = procs.engine("m", tokens_per_s=5, output_tokens=100)
    router, _ = procs.router(f"--backend=m={engine}")
    stream = client(router).chat.completions.create(model="m", messages=CHAT, stream=True)
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 5
    while engine_metric(engine, "gpufleet_sim_cancelled_total") < 1:
        assert time.monotonic() < deadline, "the engine never saw the client leave"
        time.sleep(0.05)
    assert engine_metric(engine, "vllm:num_requests_running") == 0
    assert router_metric(router, "gpurouter_in_flight_requests") == 0


def raw_request(router: str, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", int(router.rsplit(":", 1)[1]))) as sock:
        sock.sendall(data)
        sock.settimeout(timeout)
        received = b""
        while True:
            try:
                part = sock.recv(65536)
            except TimeoutError:
                break
            if not part:
                break
            received += part
        return received


def raw_stream(router: str, body: bytes, timeout: float = 10.0) -> bytes:
    """POST a streaming request and read its chunked answer to the last chunk."""
    with socket.create_connection(("127.0.0.1", int(router.rsplit(":", 1)[1]))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        sock.settimeout(timeout)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            part = sock.recv(65536)
            assert part, f"the connection closed before the last chunk: {data!r}"
            data += part
        return data


def status_and_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"] if body else {}


@pytest.fixture
def guarded_router(procs, tmp_path):
    engine = procs.engine("m")
    keys = tmp_path / "keys"
    keys.write_text("sk-good\n")
    routes = tmp_path / "routes.yaml"
    routes.write_text(f"m: [{engine}]\nempty: []\nhung: [{procs.engine('hung', hang=True)}]\n")
    router, proc = procs.router(
        "--routes",
        str(routes),
        "--api-keys-file",
        str(keys),
        "--max-body",
        "1000",
        "--client-timeout",
        "1",
        "--first-byte-timeout",
        "1",
    )
    return router, proc


AUTH = {"Authorization": "Bearer sk-good"}


@pytest.mark.parametrize(
    "body, headers, status, error_type",
    [
        (b"{not json", AUTH, 400, "invalid_request_error"),
        (b'{"messages": []}', AUTH, 400, "invalid_request_error"),
        (b'{"model": "m"}', {"Authorization": "Bearer sk-bad"}, 401, "authentication_error"),
        (b'{"model": "m"}', {}, 401, "authentication_error"),
        (b'{"model": "nope"}', AUTH, 404, "invalid_request_error"),
        (b'{"model": "m", "pad": "' + b"x" * 2000 + b'"}', AUTH, 413, "invalid_request_error"),
        (b'{"model": "empty"}', AUTH, 503, "server_error"),
        (b'{"model": "hung"}', AUTH, 504, "server_error"),
    ],
)
def test_bad_input_gets_its_status_and_the_router_keeps_serving(
    guarded_router, body, headers, status, error_type
):
    router, proc = guarded_router
    got, got_headers, raw = post(
        router + "/v1/chat/completions", body, {"Content-Type": "application/json", **headers}
    )
    assert got == status
    error = json.loads(raw)["error"]
    assert error["type"] == error_type and error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    if status == 503:
        assert got_headers["Retry-After"] == "1"
    ok, _, _ = post(router + "/v1/chat/completions", b'{"model": "m"}', AUTH)
    assert ok == 200 and proc.poll() is None


def test_headers_too_large_slow_client_and_garbage(guarded_router):
    router, proc = guarded_router
    big = b"x-big: " + b"a" * 70_000 + b"\r\n"
    answer = raw_request(router, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n" + big + b"\r\n")
    assert status_and_error(answer)[0] == 431
    slow = raw_request(
        router, b"POST /v1/completions HTTP/1.1\r\ncontent-length: 50\r\n\r\n{", timeout=4
    )
    assert status_and_error(slow)[0] == 408
    garbage = raw_request(router, b"\x00\x01 not http at all\r\n\r\n")
    assert status_and_error(garbage)[0] == 400
    assert get(router + "/healthz")[0] == 200 and proc.poll() is None


def test_all_replicas_down_is_502_and_unknown_path_404(procs):
    router, _ = procs.router(f"--backend=m=http://127.0.0.1:{free_port()}")
    status, _, raw = post(router + "/v1/chat/completions", b'{"model": "m"}')
    assert status == 502 and json.loads(raw)["error"]["type"] == "server_error"
    status, _ = get(router + "/nothing-here")
    assert status == 404


def test_metrics_and_health_are_prometheus_text(procs):
    engine = procs.engine("m")
    router, _ = procs.router(f"--backend=m={engine}")
    post(router + "/v1/completions", b'{"model": "m", "prompt": "x"}')
    status, text = get(router + "/metrics")
    text = text.decode()
    assert status == 200
    assert 'gpurouter_requests_total{model="m",status="200"} 1' in text
    assert 'gpurouter_request_duration_seconds_bucket{model="m",code="2xx",le="+Inf"} 1' in text
    assert "# TYPE gpurouter_time_to_first_token_seconds histogram" in text


def test_sigterm_lets_in_flight_requests_finish(procs):
    engine = procs.engine("m", ttft=1.0)
    router, proc = procs.router(f"--backend=m={engine}")
    result = {}

    def ask():
        result["status"] = post(router + "/v1/completions", b'{"model": "m"}')[0]

    thread = threading.Thread(target=ask)
    thread.start()
    wait_until(lambda: router_metric(router, "gpurouter_in_flight_requests") == 1)
    proc.terminate()
    thread.join()
    assert result["status"] == 200
    assert proc.wait(5) == 0


def test_a_replica_that_goes_quiet_mid_stream_gets_an_error_event(procs):
    engine = procs.engine("m", tokens_per_s=0.4, output_tokens=5)
    router, _ = procs.router(f"--backend=m={engine}", "--idle-timeout", "1")
    answer = raw_stream(router, b'{"model":"m","stream":true}')
    assert b'"code":"upstream_disconnected"' in answer and b"the replica stopped sending" in answer
    assert answer.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert router_metric(router, 'gpurouter_upstream_errors_total{model="m",kind="timeout"}') == 1


def test_workers_share_one_port_and_stop_together(procs):
    engine = procs.engine("m")
    router, proc = procs.router(f"--backend=m={engine}", "--workers", "2")
    api = client(router)
    for _ in range(10):
        assert api.completions.create(model="m", prompt="x").choices
    children = [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
    assert len(children) == 2
    assert procs.terminate(proc) == 0
    for child in children:
        assert (
            not os.path.exists(f"/proc/{child}")
            or open(f"/proc/{child}/stat").read().split(") ")[1][0] == "Z"
        )


def _second_while_first_runs(router: str) -> tuple[dict, tuple]:
    first = {}
    thread = threading.Thread(
        target=lambda: first.update(status=post(router + "/v1/completions", b'{"model":"m"}')[0])
    )
    thread.start()
    wait_until(lambda: router_metric(router, "gpurouter_in_flight_requests") == 1)
    second = post(router + "/v1/completions", b'{"model":"m"}')
    thread.join()
    return first, second


def test_a_request_to_saturated_replicas_waits_for_a_slot(procs):
    engine = procs.engine("m", ttft=1.0)
    router, _ = procs.router(f"--backend=m={engine}", "--max-in-flight", "1")
    first, (status, _, _) = _second_while_first_runs(router)
    assert (first["status"], status) == (200, 200)


def test_saturated_replicas_answer_503_with_retry_after_past_the_park_timeout(procs):
    engine = procs.engine("m", ttft=4.0)
    router, _ = procs.router(f"--backend=m={engine}", "--max-in-flight", "1", "--park-timeout", "1")
    first, (status, headers, body) = _second_while_first_runs(router)
    assert (status, headers["Retry-After"]) == (503, "5")
    assert "saturated" in json.loads(body)["error"]["message"]
    assert first["status"] == 200
    assert post(router + "/v1/completions", b'{"model":"m"}')[0] == 200


def test_sighup_reloads_the_routes_file_and_a_bad_one_changes_nothing(procs, tmp_path):
    first, second = procs.engine("a"), procs.engine("b")
    routes = tmp_path / "routes.yaml"
    routes.write_text(f"a: [{first}]\n")
    router, proc = procs.router("--routes", str(routes))

    def models():
        return [m["id"] for m in json.loads(get(router + "/v1/models")[1])["data"]]

    assert models() == ["a"]
    routes.write_text(f"b: [{second}]\n")
    proc.send_signal(signal.SIGHUP)
    wait_until(lambda: models() == ["b"], what="the new routes")
    routes.write_text("b: not-a-list\n")
    proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "routes not reloaded" in procs.log(proc), what="the refusal")
    assert post(router + "/v1/completions", b'{"model": "b"}')[0] == 200
    assert models() == ["b"] and proc.poll() is None

"""Several routers in front of the same engines: each sees the others' requests through the
engines' own queues, and an engine whose metrics never answer slows no request."""

import concurrent.futures
import time

import openai
import pytest

from tests.harness import get, post, wait_until

pytestmark = pytest.mark.integration


def router_metric(router: str, name: str) -> float:
    _, text = get(router + "/metrics")
    for line in text.decode().splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the router's metrics")


def engine_metric(engine: str, name: str) -> float:
    _, text = get(engine + "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the engine's metrics")


def test_a_router_sends_around_the_queue_another_router_built(procs):
    # One request at a time per engine, 2 s each: a queue is plain to see.
    engines = [
        procs.engine("m", max_num_seqs=1, output_tokens=20, tokens_per_s=10) for _ in range(2)
    ]
    backends = [f"--backend=m={e}" for e in engines]
    other, _ = procs.router(*backends, "--load-interval=0", "--affinity=off")
    reading, _ = procs.router(*backends, "--load-interval=0.05", "--affinity=off")
    client = openai.OpenAI(base_url=reading + "/v1", api_key="-", max_retries=0, timeout=30)
    # Now it reads m's replicas. Two requests: on its own counts, its next pick would be the
    # first engine again, the one the other router loads with two.
    for _ in range(2):
        client.completions.create(model="m", prompt="warm", max_tokens=1)
    # The other router, on its own counts, sends 3 long requests: 2 to one engine, 1 to the
    # other (it alternates). Which engine got two is known only from the engines.
    pool = concurrent.futures.ThreadPoolExecutor(8)
    body = b'{"model": "m", "prompt": "long", "max_tokens": 20}'
    sent = [pool.submit(post, other + "/v1/completions", body, None, 30) for _ in range(3)]
    wait_until(
        lambda: sorted(engine_metric(e, "vllm:num_requests_waiting") for e in engines) == [0, 1],
        timeout=10,
        what="one engine queueing a request",
    )
    busy = max(engines, key=lambda e: engine_metric(e, "vllm:num_requests_waiting"))
    assert busy == engines[0], "the other router's own counts send 2 of 3 to the first"
    time.sleep(0.3)  # a few reads
    # Own counts say both engines are free; the engines say one has 2, the other 1.
    before = {e: engine_metric(e, "vllm:request_success_total") for e in engines}
    client.completions.create(model="m", prompt="short", max_tokens=1)
    counted = {e: engine_metric(e, "vllm:request_success_total") - before[e] for e in engines}
    assert counted[busy] == 0
    assert router_metric(reading, "gpurouter_engine_load_stale_endpoints") == 0
    for future in sent:
        assert future.result(timeout=30)[0] == 200


def test_metrics_that_never_answer_slow_no_request_and_say_so(procs):
    engines = [procs.engine("m") for _ in range(2)]
    post(engines[0] + "/sim/faults", b'{"metrics": "hang"}')
    router, _ = procs.router(*(f"--backend=m={e}" for e in engines))
    client = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=5)
    client.completions.create(model="m", prompt="hi", max_tokens=1)
    wait_until(
        lambda: router_metric(router, 'gpurouter_engine_load_reads_total{outcome="timeout"}') > 2,
        timeout=10,
        what="reads of the hung engine timing out",
    )
    slowest = 0.0
    for _ in range(40):
        began = time.monotonic()
        client.completions.create(model="m", prompt="hi", max_tokens=1)
        slowest = max(slowest, time.monotonic() - began)
    assert slowest < 0.5, f"a request took {slowest:.2f} s"
    assert router_metric(router, "gpurouter_engine_load_stale_endpoints") == 1
    assert router_metric(router, 'gpurouter_engine_load_reads_total{outcome="ok"}') > 0


def test_a_bad_load_interval_or_kv_threshold_is_refused(procs):
    import subprocess

    from tests.harness import BIN

    for flag in ("--load-interval=-1", "--kv-threshold=0", "--kv-threshold=1.5"):
        done = subprocess.run(
            [str(BIN / "gpurouter"), "--backend=m=http://127.0.0.1:9", flag],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2 and flag.split("=")[0] in done.stderr, done.stderr

"""Perf gate of the data plane: the same sim engine, reached directly and through gpurouter,
in the same run. The gate is the ratio of throughputs, generous enough for a shared CI box."""

import json
import subprocess
import sys

import pytest

from bench.figures import record
from tests.harness import Processes

JSON_BODY = '{"model": "m", "max_tokens": 4}'
SSE_BODY = '{"model": "m", "max_tokens": 4, "stream": true}'
MIN_RATIO = 0.4


def load(url: str, body: str, seconds: float = 2.0) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.loadgen",
            url + "/v1/completions",
            "--body",
            body,
            "--connections",
            "32",
            "--seconds",
            str(seconds),
            "--warmup",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("router-gate"))
    try:
        engine = procs.engine("m", output_tokens=4)
        router, _ = procs.router("--backend", f"m={engine}")
        yield engine, router
    finally:
        procs.stop_all()


@pytest.mark.parametrize("kind, body", [("json", JSON_BODY), ("sse", SSE_BODY)])
def test_router_keeps_up_with_a_direct_connection(benchmark, endpoints, kind, body):
    engine, router = endpoints
    results = {}

    def measure():
        results["direct"] = load(engine, body)
        results["router"] = load(router, body)

    benchmark.pedantic(measure, rounds=1, iterations=1)
    direct, routed = results["direct"], results["router"]
    ratio = routed["rps"] / direct["rps"]
    benchmark.extra_info.update({f"direct_{k}": v for k, v in direct.items()})
    benchmark.extra_info.update({f"router_{k}": v for k, v in routed.items()})
    record(
        f"{kind}: direct {direct['rps']:.0f} req/s p50 {direct['p50_ms']:.1f} ms "
        f"p99 {direct['p99_ms']:.1f} ms | router {routed['rps']:.0f} req/s "
        f"p50 {routed['p50_ms']:.1f} ms p99 {routed['p99_ms']:.1f} ms | ratio {ratio:.2f}"
    )
    assert direct["errors"] == 0 and routed["errors"] == 0
    assert ratio >= MIN_RATIO

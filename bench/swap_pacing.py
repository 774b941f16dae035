"""Two models taking turns on one card by sleep and wake, every process at its defaults (the
control plane's tick, the agent's heartbeat and watch, the router's tick): the time from a
request for the sleeping model to its first answer, against the engine's wake time.

    .venv/bin/python -m bench.swap_pacing [TURNS] [GAP_S]

Prints each swap's time to first answer (the first two turns, cold starts, left out).
"""

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai

from tests.controlplane.conftest import spec
from tests.harness import Processes, call, control_plane

WAKE_S = 0.3
ONE_CARD = {"fabrics": [{"name": "ib-a", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 1}]}


def engine_spec(name: str) -> dict:
    command = [
        "gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}",
        "--startup-delay", "3", "--wake-delay", str(WAKE_S), "--ttft", "0.02",
    ]  # fmt: skip
    return spec(
        name=name,
        command=command,
        engine="vllm",
        sleep={"level": 1, "after": "1h", "wake_timeout": "30s"},
        min_replicas=0,
        min_residency="0s",
        gpu_memory="60GB",
        sleep_gpu_memory="2GB",
    )


def swaps(work: Path, turns: int, gap_s: float) -> list[float]:
    procs = Processes(work)
    try:
        url, _ = control_plane(procs, work / "state.sqlite")
        (work / "fleet.yaml").write_text(json.dumps(ONE_CARD))
        agent = ["gpuctl", "agent", "--server", url, "--simulate", str(work / "fleet.yaml")]
        procs.start([*agent, "--state-dir", str(work / "agent")], name="agent")
        router, _ = procs.router("--control-plane", url)
        api = openai.OpenAI(base_url=router + "/v1", api_key="-", max_retries=0, timeout=120)
        for name in ("alpha", "beta"):
            call("POST", url + "/v1/models", engine_spec(name))
        took = []
        for turn in range(turns):
            asked = time.monotonic()
            api.chat.completions.create(
                model=("alpha", "beta")[turn % 2], messages=[{"role": "user", "content": "hi"}]
            )
            took.append(time.monotonic() - asked)
            time.sleep(gap_s)
        return took[2:]
    finally:
        procs.stop_all()


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    gap_s = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    with tempfile.TemporaryDirectory() as work:
        took = swaps(Path(work), turns, gap_s)
    print(
        f"swap by sleep and wake, {gap_s:g} s between turns, wake {WAKE_S} s: first answer"
        f" median {statistics.median(took):.2f} s, max {max(took):.2f} s"
        f" ({', '.join(f'{t:.2f}' for t in took)})"
    )


if __name__ == "__main__":
    main()

"""In-process replicas sleep and wake as sim engines in processes do: told by their
assignment, taking their sleep and wake delays, and reporting Asleep, Waking, then Ready."""

import asyncio
import time

from cli.cmd_sim_engine import settings_from_args
from sim.replicas import InProcessReplicas

SIM = ["gpuctl", "sim-engine", "--port", "{port}", "--model", "{model}", "--wake-delay", "0.3"]


def assignment(sleep: int) -> dict:
    return {
        "replica": "r1",
        "model": "m",
        "command": SIM,
        "gpus": [0],
        "rank": 0,
        "nnodes": 1,
        "engine": "vllm",
        "sleep": sleep,
    }


def test_an_in_process_engine_sleeps_and_wakes_as_told():
    replicas = InProcessReplicas(settings_from_args, "127.0.0.1")
    supervisor = replicas.supervisor("127.0.0.1")

    def state_after_check(sleep: int) -> str:
        supervisor.reconcile([assignment(sleep)])
        asyncio.run(supervisor.check())
        return supervisor.reports()["r1"]["state"]

    assert state_after_check(0) == "Ready"
    engine = supervisor.running["r1"].engine
    assert state_after_check(1) == "Asleep" and engine.asleep()
    assert state_after_check(1) == "Asleep", "it stays asleep while its assignment says so"
    assert state_after_check(0) == "Waking"
    time.sleep(0.35)
    assert state_after_check(0) == "Ready" and engine.awake()

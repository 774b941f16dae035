"""Sleeping engines and adapters in the configuration a platform team runs: PostgreSQL, two
control planes with one token file and TLS, agents on their own node credentials, two routers.
An idle engine sleeps; the leader is killed while it sleeps; the new leader, from what is
stored, shows it Asleep, and a request for an adapter of it, through the router that parked
it, wakes it and has the adapter loaded there. Nothing is started cold. The wake is measured
with tokens on, against the same engine's cold start."""

from __future__ import annotations

import os
import signal
import time

import openai
import pytest

from tests.controlplane.conftest import spec
from tests.harness import wait_until
from tests.test_production_end_to_end import Production, database, engine  # noqa: F401

pytestmark = pytest.mark.integration
COLD_START_S = 3.0
DOZY = spec(
    name="dozy",
    replicas=1,
    min_replicas=0,
    min_residency="0s",
    engine="vllm",
    sleep={"level": 1, "after": "4s", "wake_timeout": "30s"},
    max_adapters=2,
    command=[
        *engine(0, 4), "--startup-delay", str(COLD_START_S), "--wake-delay", "0.3",
        "--max-loras", "2",
    ],
)  # fmt: skip
SQL = {"kind": "adapter", "name": "dozy-sql", "base": "dozy", "source": "s3://loras/sql"}


def rows(fleet: Production) -> list[dict]:
    return fleet.read("/v1/replicas?model=dozy")["items"]


def test_a_sleeper_survives_a_failover_and_an_adapter_request_wakes_it_with_tokens_on(
    procs,
    tmp_path,
    database,  # noqa: F811
):
    fleet = Production(procs, tmp_path, database)
    applied_at = time.monotonic()
    assert fleet.apply(DOZY).exit_code == 0
    wait_until(lambda: fleet.ready("dozy") == 1, timeout=60, what="dozy Ready")
    cold_start = time.monotonic() - applied_at
    (first,) = rows(fleet)
    api = openai.OpenAI(base_url=fleet.router(0) + "/v1", api_key="-", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "hi"}]
    wait_until(lambda: "dozy" in [m.id for m in api.models.list()], what="dozy's route")
    api.chat.completions.create(model="dozy", messages=messages)
    assert fleet.apply(SQL).exit_code == 0

    wait_until(lambda: rows(fleet)[0]["state"] == "Asleep", timeout=30, what="dozy asleep")
    leader = fleet.leader()
    os.kill(fleet.servers[leader].pid, signal.SIGKILL)
    fleet.leader(besides=leader, timeout=30)
    assert [(r["id"], r["state"]) for r in rows(fleet)] == [(first["id"], "Asleep")], (
        "the new leader knows it sleeps, from what was stored"
    )

    started = time.monotonic()
    answer = api.chat.completions.create(model="dozy-sql", messages=messages)
    wake = time.monotonic() - started
    assert answer.model == "dozy-sql" and answer.choices[0].message.content
    (after,) = rows(fleet)
    assert after["id"] == first["id"] and after["state"] == "Ready", "woken, not started anew"
    (sql,) = fleet.read("/v1/adapters")["items"]
    assert [h["replica"] for h in sql["replicas"] if h["state"] == "Loaded"] == [first["id"]]
    assert api.chat.completions.create(model="dozy", messages=messages).choices
    events = fleet.read("/v1/models/dozy")["events"]
    assert any("woken in" in e["message"] for e in events)
    assert not any(" placed on " in e["message"] for e in events), "no cold start"
    metrics = fleet.call("GET", fleet.url(fleet.leader()) + "/metrics")[1]
    assert 'gpufleet_wakes_total{model="dozy"} 1' in metrics
    assert 'gpufleet_sleeps_total{model="dozy"} 1' in metrics, "counted before the failover"
    print(
        f"with tokens, TLS and PostgreSQL: first answer for an adapter of a sleeping base"
        f" {wake:.2f} s (a failover before it; the base woken, the adapter loaded); cold start,"
        f" apply to Ready, {cold_start:.2f} s"
    )

"""A router's tenant counters with `--workers`: whichever worker answers a scrape, it answers the
process's totals, and they never go back between scrapes."""

import hashlib
import json
import threading

import pytest

from tests.harness import get, post, wait_until

pytestmark = pytest.mark.integration
KEY = "team-key-1"
METRICS = {"Authorization": "Bearer prom-token"}


def requests_counted(router) -> float:
    text = get(router + "/metrics", METRICS)[1].decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('gpurouter_tenant_requests_total{tenant="team"')
    )


def test_every_scrape_of_a_router_with_workers_counts_all_its_workers(procs, tmp_path):
    engine = procs.engine("m")
    tenants = tmp_path / "tenants.yaml"
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    tenants.write_text(f"tenants:\n  - name: team\n    key_sha256: [{digest}]\n")
    router, _ = procs.router(f"--backend=m={engine}", "--workers", "2", "--tenants-file",
                             str(tenants), "--metrics-token", "prom-token")  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = json.dumps({"model": "m", "prompt": "x"}).encode()
    wait_until(lambda: post(router + "/v1/completions", body, headers)[0] == 200, what="router")
    sent = [1]  # the request above
    done = threading.Event()

    def traffic():
        while not done.is_set():
            status = post(router + "/v1/completions", body, headers)[0]
            assert status == 200
            sent[0] += 1

    senders = [threading.Thread(target=traffic) for _ in range(4)]  # several connections:
    for sender in senders:  # the kernel spreads them over both workers
        sender.start()
    scraped = []
    try:
        for _ in range(50):
            scraped.append(requests_counted(router))
    finally:
        done.set()
        for sender in senders:
            sender.join(10)
    assert scraped == sorted(scraped), "a counter that went back reads as a reset"
    wait_until(lambda: requests_counted(router) == sent[0], timeout=5,
               what="the last tick's counts of both workers")  # fmt: skip

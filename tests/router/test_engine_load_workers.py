"""One engine reader per router process: with `--workers 4` each engine's /metrics is read at
most once an interval, as by one worker (worker 0 reads for all, router/load/shared.py), and
every worker still routes on fresh readings."""

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness import get, post

pytestmark = pytest.mark.integration
READS = re.compile(rb"^gpufleet_sim_metrics_reads_total (\d+)", re.M)
STALE = re.compile(rb"^gpurouter_engine_load_stale_endpoints (\d+)", re.M)
READ_TOTAL = re.compile(rb'^gpurouter_engine_load_reads_total\{outcome="ok"\} (\d+)', re.M)


def reads(engine: str) -> int:
    return int(READS.search(get(f"{engine}/metrics")[1]).group(1))


def reads_per_engine_per_second(procs, engines: list[str], workers: int) -> tuple[float, list]:
    url, router = procs.router(*[f"--backend=m={e}" for e in engines], "--workers", str(workers))
    chat = b'{"model": "m", "messages": [], "max_tokens": 2}'
    with ThreadPoolExecutor(8) as pool:  # every worker sends to both engines: both are read
        assert set(pool.map(lambda _: post(f"{url}/v1/chat/completions", chat)[0],
                            range(80))) == {200}  # fmt: skip
    time.sleep(1.0)
    before = [reads(e) for e in engines]
    began = time.monotonic()
    # Requests of uneven length go on meanwhile, so that no engine's reading stays the same:
    # each is read every round, not every few as a quiet one.
    def send_for_four_seconds(worker: int) -> None:
        n = 0
        while time.monotonic() - began < 4.0:
            n += 1
            body = b'{"model": "m", "messages": [], "max_tokens": %d}' % (1 + (n * worker) % 9)
            assert post(f"{url}/v1/chat/completions", body)[0] == 200

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send_for_four_seconds, range(1, 5)))
    rate = sum(reads(e) - b for e, b in zip(engines, before, strict=True)) / len(engines)
    rate /= time.monotonic() - began
    scrapes = [get(f"{url}/metrics")[1] for _ in range(24)]  # spread over the workers
    procs.terminate(router)  # it reads no more
    return rate, scrapes


def test_workers_share_one_reader_and_all_route_on_fresh_readings(procs):
    engines = [procs.engine("m", tokens_per_s=40) for _ in range(2)]
    rate, scrapes = reads_per_engine_per_second(procs, engines, 4)
    # The bound: a router process reads an engine at most once an interval (0.1 s, jittered
    # by 10%), whatever its workers; each of four reading for itself made it 32 a second.
    assert 1 < rate <= 12.5, rate
    assert all(int(STALE.search(s).group(1)) == 0 for s in scrapes), "every worker is fresh"
    totals = [int(READ_TOTAL.search(s).group(1)) for s in scrapes]
    assert totals == sorted(totals) and totals[0] > 0, "the process's reads, never going back"

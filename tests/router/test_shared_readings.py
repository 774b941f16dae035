"""The files through which a router's workers share one engine reader (router/load/shared.py):
what the others want read reaches the reader, and its readings reach them, each used for what
is left of its validity and marked with the worker's own requests in flight."""

import asyncio
import time

from router.load.shared import LoadFollower, SharedReadings
from router.path import fastpath_py

URL = "http://127.0.0.1:9001"


def test_wanted_urls_reach_the_reader_and_readings_the_followers(tmp_path):
    reader, follower = SharedReadings(str(tmp_path), 0), SharedReadings(str(tmp_path), 1)
    follower.want((URL,))
    assert reader.wanted() == {URL}
    table = fastpath_py.EndpointTable()
    table.update({"m": [("r1", URL)]})
    slot = table.acquire("m")  # one request of this worker in flight: sent to, so a target
    now = time.monotonic()
    reader.publish({URL: [3, 5, 0.5, now, 0.3]}, {"ok": 7}, 0.01, 0, 1)

    async def one_round() -> LoadFollower:
        taking = LoadFollower(table, follower, interval_s=0.1)
        taking.start()
        await asyncio.sleep(0.02)
        taking.stop()
        return taking

    taking = asyncio.run(one_round())
    load, fresh, _ = table.load_of(slot)
    assert fresh and load == 3 + 5, "the engine's 8, of which this worker's 1 is its own"
    report = taking.report()
    assert report == {"r1": [3, 5, 0.5, report["r1"][3]]} and 0 <= report["r1"][3] < 1
    assert 'gpurouter_engine_load_reads_total{outcome="ok"} 7' in taking.metrics_lines()
    time.sleep(0.35)  # the reading applied is past its validity
    reader.publish({URL: [3, 5, 0.5, now - 1.0, 0.3]}, {"ok": 8}, 0.01, 0, 1)  # so is this one
    asyncio.run(one_round())
    assert not table.load_of(slot)[1], "a reading past its validity is not used"


def test_a_reader_without_siblings_reads_what_it_wants_alone(tmp_path):
    assert SharedReadings(str(tmp_path), 0).wanted() == set()

"""The router reads the engines' own load off the request path: each engine kind's series,
and every kind of bad metrics page (no answer, 500, 10 MB, NaN, negative, no known series)
gives no reading and slows nothing."""

import asyncio
import math
import os
import threading
import time

import pytest
from aiohttp import web

from router.load import _loadread, loadread_py
from router.load.engineload import QUIET_AFTER, QUIET_EVERY, LoadReader
from router.load.loadseries import BadReading, Reading
from router.path import _fastpath, fastpath_py
from sim.engine import EngineSettings, Faults, SimEngine
from tests.harness import wait_until


@pytest.fixture(params=["extension", "twin"])
def parse_load(request):
    """Each page test reads with the C scanner and with its Python twin."""
    return {"extension": _loadread, "twin": loadread_py}[request.param].scan_load


def test_each_engine_kinds_series_are_read_summed_over_label_sets(parse_load):
    vllm = (
        b"# HELP vllm:num_requests_waiting Requests waiting.\n"
        b"# TYPE vllm:num_requests_waiting gauge\n"
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        b'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0\n'
        b'vllm:num_requests_running{model_name="m"} 8.0\n'
        b'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
        b"vllm:num_requests_running_total 99\n"
        b'vllm:num_requests_running{model_name="n"} 1 1700000000000\n'
    )
    assert parse_load(vllm) == Reading(5, 9, 0.5), "a timestamp is not the value"
    sglang = b"sglang:num_queue_reqs 4\nsglang:num_running_reqs 2\nsglang:token_usage 0.25\n"
    assert parse_load(sglang) == Reading(4, 2, 0.25)
    llama = b"llamacpp:requests_deferred 1\nllamacpp:requests_processing 1"
    assert parse_load(llama) == Reading(1, 1, 0.0)
    older_vllm = b"vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.9\n"
    assert parse_load(older_vllm) == Reading(0, 1, 0.9)


@pytest.mark.parametrize(
    "page",
    [
        b"vllm:num_requests_waiting NaN\n",
        b"vllm:num_requests_waiting -1\n",
        b"vllm:kv_cache_usage_perc +Inf\n",
        b"vllm:num_requests_running lots\n",
        b"vllm:num_requests_running \n",
        b"vllm:num_requests_running 0x10\n",
        b"vllm:num_requests_running 1_000\n",
        b"vllm:num_requests_running 1.2.3\n",
    ],
)
def test_a_value_that_is_not_a_finite_non_negative_number_gives_no_reading(page, parse_load):
    with pytest.raises(BadReading):
        parse_load(page)


def test_a_page_without_a_known_series_gives_none(parse_load):
    assert parse_load(b"") is None
    assert parse_load(b"process_cpu_seconds_total 1\n# vllm:num_requests_waiting 3\n") is None
    assert parse_load(b"\x00\xff garbage \n\n{}") is None
    assert parse_load(b"vllm:num_requests_running\n") is None
    assert parse_load(b'vllm:num_requests_running{model_name="m" 1\n') is None, "unclosed"


async def engines(faults: list[str]):
    """Sim engines on loopback, one per metrics fault ("" for a healthy one)."""
    runners, urls, sims = [], [], []
    for fault in faults:
        sim = SimEngine(EngineSettings(["m"], faults=Faults(metrics=fault)))
        runner = web.AppRunner(
            sim.app(), access_log=None, handler_cancellation=True, shutdown_timeout=0.1
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        sims.append(sim)
        urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
    return runners, urls, sims


class EnginesOnTheirOwnLoop:
    """Sim engines served by a thread and event loop of their own, so that the loop under test
    does the reader's work only (a 2 MiB page is built in Python)."""

    def __init__(self, faults: list[str]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engines", daemon=True)
        self.thread.start()
        self.runners, self.urls, self.sims = self._run(engines(faults))

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def close(self) -> None:
        for runner in self.runners:
            self._run(runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def stop_all(reader, sims, runners) -> None:
    reader.stop()
    sims[0].scheduler.running = 0
    for runner in runners:
        await runner.cleanup()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


# Each kind of page met at least this often: ok; hang and slow (timeout); error; huge and big
# (too_large); nan, negative and labels (bad_value); unknown (no_series); reset (error).
ENOUGH = {"ok": 5, "timeout": 4, "http_error": 5, "too_large": 15, "bad_value": 10,
          "no_series": 5, "error": 5}  # fmt: skip


def enough(outcomes: dict) -> bool:
    return all(outcomes.get(kind, 0) >= least for kind, least in ENOUGH.items())


@pytest.mark.parametrize("module", [_fastpath, fastpath_py], ids=["extension", "twin"])
def test_bad_metrics_give_no_reading_while_good_ones_are_read(module):
    faults = ["", "hang", "error", "huge", "nan", "negative", "unknown", "big", "labels", "slow",
              "reset"]  # fmt: skip

    served = EnginesOnTheirOwnLoop(faults)

    async def scenario():
        table = module.EndpointTable()
        table.update({"m": [(f"r{i}", url) for i, url in enumerate(served.urls)]})
        table.release(table.acquire("m"))  # sent to: its replicas are read
        # Read every 0.1 s, a page late after 0.2 s: eleven engines served by one thread of
        # this process (a 2 MiB page built in Python each round) answer within that even with
        # a busy neighbour on the machine; at 0.05 s they did not, and every read timed out.
        reader = LoadReader(table, interval_s=0.1)
        reader.start()
        try:
            loop = asyncio.get_running_loop()
            # While every round meets a hung page, a request's pick is never held up: no turn
            # of the loop does 0.1 s of work (in the loop thread's CPU time, which a busy
            # neighbour on the machine does not stretch as it stretches the clock), nor waits
            # on a page (half a second is a hang whatever the neighbours do).
            # At least 1.5 s; then until every kind of bad page was met often enough, which a
            # busy neighbour can make take longer (at most 8 s, the bounds below unchanged).
            began_all = loop.time()
            most_work = longest = 0.0
            descriptors = []
            expected_fresh = {f"r{i}": fault == "" for i, fault in enumerate(faults)}

            def fresh() -> dict:
                return {eid: table.load_of(slot)[1] for slot, eid, _ in table.endpoints("m")}

            while loop.time() < began_all + 1.5 or (
                loop.time() < began_all + 8
                and not (enough(reader.outcomes) and fresh() == expected_fresh)
            ):
                began, began_work = loop.time(), time.thread_time()
                table.release(table.acquire("m"))
                await asyncio.sleep(0.005)
                most_work = max(most_work, time.thread_time() - began_work)
                longest = max(longest, loop.time() - began)
                descriptors.append(open_descriptors())
            assert most_work < 0.1 and longest < 0.5, (most_work, longest)
            assert fresh() == expected_fresh, (loop.time() - began_all, reader.outcomes)
            outcomes = reader.outcomes
            assert enough(outcomes), outcomes
            assert set(reader.report()) == {"r0"}
            assert reader.stale == len(faults) - 1
            text = "\n".join(reader.metrics_lines())
            assert 'gpurouter_engine_load_reads_total{outcome="timeout"}' in text
            assert f"gpurouter_engine_load_stale_endpoints {len(faults) - 1}" in text
            # Nothing piles up: a connection at most per engine, descriptors flat.
            assert len(reader.connections) <= len(faults) and reader.outstanding <= len(faults)
            settled = descriptors[len(descriptors) // 3 :]
            assert max(settled) - min(settled) <= 2 * len(faults), (min(settled), max(settled))
        finally:
            reader.stop()

    try:
        asyncio.run(scenario())
    finally:
        served.close()


def test_a_reading_steers_picks_and_its_end_gives_them_back_to_own_counts():
    async def scenario():
        runners, urls, sims = await engines(["", ""])
        table = _fastpath.EndpointTable()
        table.update({"m": [("a", urls[0]), ("b", urls[1])]})
        table.release(table.acquire("m"))
        reader = LoadReader(table, interval_s=0.05)
        reader.start()
        try:
            # Another router's requests hold engine a's queue.
            sims[0].scheduler.running = 6
            sims[0].scheduler.held_blocks = 0
            await asyncio.sleep(0.2)
            slot_a = next(s for s, eid, _ in table.endpoints("m") if eid == "a")
            assert table.load_of(slot_a) == (6, True, False)
            picks = [table.endpoint_id(table.acquire("m")) for _ in range(6)]
            assert picks == ["b"] * 6, "b carries 6 of ours before a's 6 are matched"
            assert reader.report()["a"][:2] == [0, 6]
            connection = reader.connections[urls[0]]
            reader.stop()
            # A quiet engine's reading is used until its next read would be due, and a little.
            valid_s = reader.valid_s
            if connection.same >= QUIET_AFTER:
                valid_s = (reader.quiet_gap(connection.same) + 2) * reader.interval_s
            await asyncio.sleep(valid_s + 0.1)
            assert table.load_of(slot_a) == (0, False, False)
        finally:
            await stop_all(reader, sims, runners)

    asyncio.run(scenario())


def test_replicas_of_models_not_sent_to_in_the_last_minute_are_not_read():
    async def scenario():
        runners, urls, _ = await engines(["", ""])
        table = _fastpath.EndpointTable()
        table.update({"m": [("a", urls[0])], "quiet": [("b", urls[1])]})
        table._pin_clock(1000.0)
        table.release(table.acquire("m"))
        table._pin_clock(1030.0)
        assert [t[1] for t in table.load_targets(60)] == ["a"]
        table._pin_clock(1061.0)
        assert table.load_targets(60) == []
        for runner in runners:
            await runner.cleanup()

    asyncio.run(scenario())


def test_kv_use_is_capped_at_one_and_nan_never_reaches_the_table(parse_load):
    assert parse_load(b"sglang:token_usage 3.5\nsglang:num_queue_reqs 0\n").kv_use == 1.0
    assert not any(math.isnan(v) for v in (parse_load(b"sglang:token_usage 0\n").kv_use,))


def test_the_sim_engine_refuses_a_metrics_fault_it_does_not_know():
    with pytest.raises(ValueError, match="metrics: one of"):
        Faults().update({"metrics": "sometimes"})
    faults = Faults()
    faults.update({"metrics": "nan"})
    assert faults.metrics == "nan"


def unanswering_listener():
    """A loopback address whose connects hang, as to an engine that drops packets: a listener
    whose backlog is full and which never accepts (Linux drops the SYNs past the backlog)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(server.getsockname())
        fillers.append(filler)
    return server, fillers


@pytest.mark.parametrize("module", [_fastpath, fastpath_py], ids=["extension", "twin"])
def test_an_engine_that_never_answers_a_connect_holds_no_descriptors(module):
    server, fillers = unanswering_listener()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"

    async def scenario():
        table = module.EndpointTable()
        table.update({"m": [("silent", url)]})
        table.release(table.acquire("m"))
        reader = LoadReader(table, interval_s=0.02)
        reader.start()
        try:
            await asyncio.sleep(0.3)  # a few rounds: connects opened and given up
            before = open_descriptors()
            await asyncio.sleep(2.0)  # about fifty more rounds
            after = open_descriptors()
            assert reader.outcomes["timeout"] + reader.outcomes["error"] >= 20
            assert after - before <= 2, f"{after - before} descriptors piled up"
        finally:
            reader.stop()

    try:
        asyncio.run(scenario())
    finally:
        for sock in (server, *fillers):
            sock.close()


@pytest.mark.integration
def test_the_router_raises_its_descriptor_limit_and_says_so(procs):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The router inherits a low soft limit, as from a shell's default ulimit -n.
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
    try:
        _, proc = procs.router("--backend", "m=http://127.0.0.1:1")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    limits = open(f"/proc/{proc.pid}/limits").read()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    soft_seen, hard_seen = line.split()[3:5]
    assert soft_seen == hard_seen, line
    # The port opens a moment before the line that says so is written.
    wait_until(lambda: f"{soft_seen} descriptors" in procs.log(proc), 10.0, "the limit logged")
    assert hard == resource.RLIM_INFINITY or int(hard_seen) == hard


def test_a_quiet_engine_is_read_every_few_rounds_until_its_reading_changes():
    async def scenario():
        runners, urls, sims = await engines([""])
        table = _fastpath.EndpointTable()
        table.update({"m": [("a", urls[0])]})
        table.release(table.acquire("m"))
        reader = LoadReader(table, interval_s=0.05)
        reader.start()
        try:
            await asyncio.sleep(0.3)  # its first reads: the same each time
            (connection,) = reader.connections.values()
            assert connection.same >= QUIET_AFTER and reader.quiet == 1
            rounds, reads = reader.rounds, reader.outcomes["ok"]
            await asyncio.sleep(1.0)
            quiet_reads = reader.outcomes["ok"] - reads
            quiet_rounds = reader.rounds - rounds
            assert quiet_reads <= quiet_rounds // QUIET_EVERY + 1, (quiet_reads, quiet_rounds)
            gap = reader.quiet_gap(connection.same)  # grown as it stayed the same
            assert QUIET_EVERY < gap <= reader.quiet_most, gap
            sims[0].scheduler.running = 3  # another router's requests arrive
            changed_in = reader.rounds
            slot = table.endpoints("m")[0][0]
            for _ in range(300):
                if table.load_of(slot)[0] == 3:
                    break
                await asyncio.sleep(0.01)
            assert reader.rounds - changed_in <= gap + 1, "seen by the next quiet read"
            rounds, reads = reader.rounds, reader.outcomes["ok"]
            for n in range(12):  # and it keeps moving: read every round
                sims[0].scheduler.running = 4 + n
                await asyncio.sleep(0.05)
            moving_reads = reader.outcomes["ok"] - reads
            assert moving_reads >= reader.rounds - rounds - QUIET_EVERY, "at most one quiet wait"
        finally:
            await stop_all(reader, sims, runners)

    asyncio.run(scenario())


def test_a_stopped_reader_opens_no_connection_and_sends_nothing():
    """Stopping closes the connection of a read under way, which finishes that read; the
    engine waiting its turn behind it (concurrency 1) is not read then, nor ever."""

    async def scenario():
        runners, urls, sims = await engines(["hang", "hang"])
        table = _fastpath.EndpointTable()
        table.update({"m": [("a", urls[0]), ("b", urls[1])]})
        for _ in range(2):
            table.acquire("m")
        reader = LoadReader(table, interval_s=0.05, concurrency=1)
        reader.start()
        try:
            for _ in range(200):
                if reader.reading and reader.pending:
                    break
                await asyncio.sleep(0.01)
            assert reader.reading and reader.pending, "one read under way, one waiting"
            reader.stop()
            await asyncio.sleep(0.2)  # the closed connection's loss reaches the reader
            assert not reader.connections, list(reader.connections)
            assert not reader.reading
        finally:
            await stop_all(reader, sims, runners)

    asyncio.run(scenario())


def test_the_endpoints_to_read_are_built_again_only_when_what_they_follow_from_changes():
    """1,000 endpoints gone over twice a second cost 0.008 of a core: the list is kept while the
    route version and the models sent to lately stay the same, and follows either at once."""
    table = _fastpath.EndpointTable()
    table.update({"m": [("a", "http://127.0.0.1:9/a")], "n": [("b", "http://127.0.0.1:9/b")]})
    table._pin_clock(1000.0)
    table.release(table.acquire("m"))
    reader = LoadReader(table, interval_s=0.1)
    reader.refresh(0.0)
    built = reader.targets
    assert list(built) == ["http://127.0.0.1:9/a"]
    reader.refresh(0.0)
    assert reader.targets is built, "nothing changed: the same list"
    table.release(table.acquire("n"))  # a model first sent to
    reader.refresh(0.0)
    assert sorted(reader.targets) == ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]
    routes = {"m": [("a", "http://127.0.0.1:9/a"), ("a2", "http://127.0.0.1:9/a2")]}
    table.update({**routes, "n": [("b", "http://127.0.0.1:9/b")]})
    reader.refresh(0.0)  # a new route version: a new endpoint of a model sent to lately
    assert sorted(reader.targets) == [f"http://127.0.0.1:9/{e}" for e in ("a", "a2", "b")]
    table._pin_clock(1000.0 + 61)  # a minute without requests: nothing to read
    reader.refresh(0.0)
    assert reader.targets == {}

import threading

import pytest

ROUTES = {"llama": [("r1", "http://127.0.0.1:1"), ("r2", "http://127.0.0.1:2")]}


def make(fastpath, routes=ROUTES, at=100.0, **options):
    table = fastpath.EndpointTable(**options)
    table._pin_clock(at)
    table.update(routes)
    return table


def test_unknown_model_and_model_without_endpoints(fastpath):
    table = make(fastpath, {"llama": [("r1", "u")], "empty": []})
    assert table.acquire("nope") == fastpath.NO_MODEL
    assert table.acquire("empty") == fastpath.NO_ENDPOINT


def test_least_loaded_wins_and_ties_rotate(fastpath):
    table = make(fastpath, {"m": [("a", "u"), ("b", "u"), ("c", "u")]})
    first = [table.acquire("m") for _ in range(3)]
    assert sorted(table.endpoint_id(s) for s in first) == ["a", "b", "c"]
    table.release(first[1])
    assert table.acquire("m") == first[1]
    for slot in first:
        table.release(slot)
    table.release(first[1])
    picks = [table.acquire("m") for _ in range(6)]
    for slot in picks:
        table.release(slot)
    assert {table.endpoint_id(s) for s in picks} == {"a", "b", "c"}
    assert all(picks.count(s) == 2 for s in set(picks))


def test_saturated_when_every_endpoint_is_at_its_limit(fastpath):
    table = make(fastpath, {"m": [("a", "u")]}, max_in_flight=2)
    assert table.acquire("m") >= 0 and table.acquire("m") >= 0
    assert table.acquire("m") == fastpath.SATURATED


def test_ejection_after_consecutive_failures_then_expiry(fastpath):
    table = make(fastpath, {"m": [("a", "u"), ("b", "u")]}, failures_to_eject=3, base_ejection_s=30)
    a = next(s for s, i, _ in table.endpoints("m") if i == "a")
    for _ in range(3):
        table.release(a, failed=True)
    assert table.is_ejected(a)
    assert {table.acquire("m") for _ in range(4)} == {
        next(s for s, i, _ in table.endpoints("m") if i == "b")
    }
    table._pin_clock(131.0)
    assert not table.is_ejected(a)
    picked = {table.acquire("m") for _ in range(4)}
    assert a in picked


def test_a_success_resets_the_failure_streak(fastpath):
    table = make(fastpath, {"m": [("a", "u"), ("b", "u")]}, failures_to_eject=3)
    a = table.endpoints("m")[0][0]
    for failed in (True, True, False, True, True):
        table.release(a, failed=failed)
    assert not table.is_ejected(a)


def test_ejection_time_grows_with_repeats_and_is_capped(fastpath):
    table = make(
        fastpath,
        {"m": [("a", "u"), ("b", "u")]},
        failures_to_eject=1,
        base_ejection_s=10,
        max_ejection_s=25,
    )
    a = table.endpoints("m")[0][0]
    now = 100.0
    for expected in (10, 20, 25):
        table._pin_clock(now)
        table.release(a, failed=True)
        table._pin_clock(now + expected - 0.5)
        assert table.is_ejected(a)
        table._pin_clock(now + expected + 0.5)
        assert not table.is_ejected(a)
        table.acquire("m")  # lifts the expired ejection
        now += expected + 1


def test_never_ejects_the_last_endpoint_nor_more_than_the_share(fastpath):
    single = make(fastpath, {"m": [("a", "u")]}, failures_to_eject=1)
    single.release(0, failed=True)
    assert not single.is_ejected(0)
    four = make(
        fastpath,
        {"m": [(str(i), "u") for i in range(4)]},
        failures_to_eject=1,
        max_ejection_percent=50,
    )
    for slot, _, _ in four.endpoints("m"):
        four.release(slot, failed=True)
    assert sum(four.is_ejected(s) for s, _, _ in four.endpoints("m")) == 2
    assert four.acquire("m") >= 0


def test_update_keeps_survivors_and_retires_removed(fastpath):
    table = make(fastpath)
    s1 = table.acquire("llama")
    r1 = table.endpoint_id(s1)
    table._pin_clock(103.0)
    table.update({"llama": [(r1, "http://127.0.0.1:1"), ("r3", "http://127.0.0.1:3")]})
    assert table.in_flight(s1) == 1
    assert dict((i, s) for s, i, _ in table.endpoints("llama"))[r1] == s1
    table._pin_clock(105.0)
    snap = table.snapshot()
    assert snap["used"] == {r1: 0.0}
    assert snap["watched"] == {r1: 5.0, "r3": 2.0}


def test_release_of_a_removed_endpoint_is_safe(fastpath):
    table = make(fastpath)
    slot = table.acquire("llama")
    table.update({"other": [("x", "u")]})
    table.release(slot, failed=True)
    assert table.in_flight(slot) == 0
    assert table.acquire("llama") == fastpath.NO_MODEL
    table.release(10_000)
    table.release(-1)


def test_snapshot_used_versus_watched(fastpath):
    table = make(fastpath, at=100.0)
    slot = table.acquire("llama")
    table._pin_clock(103.0)
    snap = table.snapshot()
    used_id = table.endpoint_id(slot)
    assert snap["used"] == {used_id: 0.0}, "in flight means in use now"
    table.release(slot)
    table._pin_clock(110.0)
    snap = table.snapshot()
    assert snap["used"] == {used_id: 7.0}
    assert snap["watched"] == {"r1": 10.0, "r2": 10.0}


def test_never_used_endpoints_are_absent_from_used(fastpath):
    table = make(fastpath)
    table._pin_clock(500.0)
    assert table.snapshot()["used"] == {}
    assert set(table.snapshot()["watched"]) == {"r1", "r2"}


def test_duplicate_endpoint_is_refused_and_the_table_is_kept(fastpath):
    table = make(fastpath)
    with pytest.raises(ValueError, match="twice"):
        table.update({"llama": [("r1", "u"), ("r1", "v")]})
    assert [i for _, i, _ in table.endpoints("llama")] == ["r1", "r2"]


def test_version_follows_updates(fastpath):
    table = make(fastpath)
    table.update(ROUTES, version=42)
    assert table.version == 42


def test_threads_acquire_release_while_another_updates_and_snapshots(fastpath):
    table = fastpath.EndpointTable()
    table.update({"m": [(f"e{i}", "u") for i in range(8)]})
    stop = threading.Event()
    errors = []

    def worker():
        try:
            for _ in range(20_000):
                slot = table.acquire("m")
                if slot >= 0:
                    table.release(slot)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def churn():
        i = 0
        while not stop.is_set():
            i += 1
            table.update({"m": [(f"e{(i + k) % 12}", "u") for k in range(8)]})
            table.snapshot()

    updater = threading.Thread(target=churn)
    updater.start()
    workers = [threading.Thread(target=worker) for _ in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    updater.join()
    assert not errors
    for slot, _, _ in table.endpoints("m"):
        assert table.in_flight(slot) == 0
    snapshot = table.snapshot()
    assert set(snapshot["watched"]) == {i for _, i, _ in table.endpoints("m")}
    assert set(snapshot["used"]) <= set(snapshot["watched"]), "a retired endpoint leaked"


@pytest.mark.parametrize("switch, extension", [("1", False), ("0", True)])
def test_the_kill_switch_selects_the_twin_at_import(switch, extension):
    import os
    import subprocess
    import sys

    code = "import router.path.fastpath as f; print(f.USING_EXTENSION, f.EndpointTable.__module__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GPUROUTER_NO_EXTENSIONS": switch},
    ).stdout.split()
    expected = "router.path._fastpath" if extension else "router.path.fastpath_py"
    assert out == [str(extension), expected]


def test_exclude_skips_the_slots_already_tried(fastpath):
    table = make(fastpath, {"m": [("a", "u"), ("b", "u"), ("c", "u")]})
    a, b, c = (slot for slot, _, _ in table.endpoints("m"))
    assert {table.acquire("m", exclude=(a, b)) for _ in range(3)} == {c}
    assert table.acquire("m", exclude=(a, b, c)) == fastpath.NO_ENDPOINT


def test_any_number_of_slots_can_be_excluded(fastpath):
    """An adapter held on 17 or more replicas leaves them all out of its resolver route."""
    table = make(fastpath, {"m": [(f"r{i}", "u") for i in range(40)]})
    slots = [slot for slot, _, _ in table.endpoints("m")]
    for held in (17, 39):
        picked = [table.acquire("m", exclude=tuple(slots[:held])) for _ in range(3 * (40 - held))]
        assert set(picked) == set(slots[held:]), held
        for slot in picked:
            table.release(slot)
    assert table.acquire("m", exclude=tuple(slots)) == fastpath.NO_ENDPOINT


def test_a_key_sticks_to_one_endpoint_until_its_load_is_over_the_bound(fastpath):
    table = make(fastpath, {"m": [(f"r{i}", "u") for i in range(4)]})
    for key in (1, 77, 2**63 + 5):
        picks = set()
        for _ in range(5):
            slot = table.acquire("m", key=key)
            picks.add(slot)
            table.release(slot)
        assert len(picks) == 1, "an idle model sends one key to one endpoint"
    held = [table.acquire("m", key=42) for _ in range(8)]
    # ceil(1.25 * (in-flight + 1) / 4) bounds every endpoint: 8 requests spread over >= 3.
    assert max(held.count(s) for s in held) <= 3
    assert len(set(held)) >= 3


def test_keyed_picks_move_only_the_keys_of_a_removed_endpoint(fastpath):
    five = {"m": [(f"r{i}", "u") for i in range(5)]}
    table = make(fastpath, five)

    def owner(key):
        slot = table.acquire("m", key=key)
        table.release(slot)
        return table.endpoint_id(slot)

    before = {key: owner(key) for key in range(1, 2001)}
    table.update({"m": five["m"][:4]})
    after = {key: owner(key) for key in range(1, 2001)}
    moved = [k for k in before if before[k] != after[k]]
    assert all(before[k] == "r4" for k in moved)
    assert 300 <= sum(1 for v in before.values() if v == "r4") <= 500  # about 1/5 of the keys


def test_release_says_when_it_ejected(fastpath):
    table = make(fastpath, {"m": [("a", "u"), ("b", "u")]}, failures_to_eject=2)
    a = table.endpoints("m")[0][0]
    assert table.release(table.acquire("m", exclude=(1 - a,)), failed=True) is False
    assert table.release(table.acquire("m", exclude=(1 - a,)), failed=True) is True


def test_a_slot_that_never_existed_is_an_index_error(fastpath):
    table = make(fastpath)
    for slot in (-1, 2, 10_000):
        with pytest.raises(IndexError):
            table.endpoint_url(slot)
        with pytest.raises(IndexError):
            table.endpoint_id(slot)


def test_a_removed_endpoint_with_requests_on_it_is_still_reported_in_use(fastpath):
    table = make(fastpath, {"m": [("a", "u"), ("b", "u")]})
    a = table.endpoints("m")[0][0]
    slot = table.acquire("m", exclude=(1 - a,))
    table.update({"m": [("b", "u")]})  # a's route withdrawn while a request is on it
    snap = table.snapshot()
    assert snap["in_flight"] == {"a": 1} and snap["used"]["a"] == 0.0
    assert "a" not in snap["watched"], "it is no longer in the table"
    table.release(slot)
    snap = table.snapshot()
    assert "a" not in snap["in_flight"] and "a" not in snap["used"]


# Engine-reported load (router/load/engineload.py gives the readings).


@pytest.fixture(params=["extension", "twin"])
def loaded_table(request):
    from router.path import _fastpath, fastpath_py

    module = _fastpath if request.param == "extension" else fastpath_py
    table = module.EndpointTable(load_factor=1.25, kv_threshold=0.8)
    table.update({"m": [("a", "http://a"), ("b", "http://b"), ("c", "http://c")]})
    table._pin_clock(100.0)
    return table


def slot_of(table, endpoint_id):
    return next(slot for slot, eid, _ in table.endpoints("m") if eid == endpoint_id)


def test_a_fresh_reading_adds_the_engines_other_requests_to_our_own(loaded_table):
    table = loaded_table
    a, b, c = (slot_of(table, e) for e in "abc")
    marks = {slot: mark for slot, _, _, mark in table.load_targets(60)}
    assert marks == {}, "nothing sent yet: no model to read"
    table.release(table.acquire("m"))
    marks = {slot: mark for slot, _, _, mark in table.load_targets(60)}
    assert set(marks) == {a, b, c}
    # Another router's requests queue on a and b: this router sees them only through the engine.
    assert table.set_load(a, "a", 5, 8, 0.1, marks[a], 0.3)
    assert table.set_load(b, "b", 0, 4, 0.1, marks[b], 0.3)
    assert table.set_load(c, "c", 0, 1, 0.1, marks[c], 0.3)
    picks = [table.acquire("m") for _ in range(4)]
    assert picks[:3] == [c, c, c] and picks[3] in (b, c)
    assert table.load_of(c) == (1 + table.in_flight(c), True, False)
    # Our own requests in flight when the reading was asked for are counted once.
    for _ in range(table.in_flight(c)):
        table.release(c)
    assert table.set_load(c, "c", 0, 2, 0.1, 2, 0.3)
    assert table.load_of(c) == (0, True, False), "the engine's 2 were ours, and they ended"


def test_a_stale_reading_is_not_used(loaded_table):
    table = loaded_table
    a = slot_of(table, "a")
    table.set_load(a, "a", 50, 0, 0.0, 0, 0.3)
    table._pin_clock(100.31)
    assert table.load_of(a) == (0, False, False)
    picks = {table.acquire("m") for _ in range(3)}
    assert len(picks) == 3, "own counts again: one each"


def test_a_reading_for_an_endpoint_that_left_its_slot_is_refused(loaded_table):
    table = loaded_table
    a = slot_of(table, "a")
    table.update({"m": [("b", "http://b"), ("c", "http://c")]})
    assert not table.set_load(a, "a", 5, 5, 0.0, 0, 1.0)
    assert not table.set_load(999, "a", 5, 5, 0.0, 0, 1.0)


def test_affinity_passes_over_a_replica_whose_kv_cache_is_full(loaded_table):
    table = loaded_table
    key = 12345
    preferred = table.acquire("m", key)
    table.release(preferred)
    eid = table.endpoint_id(preferred)
    table.set_load(preferred, eid, 0, 0, 0.95, 0, 1.0)
    assert table.load_of(preferred)[2]
    assert table.acquire("m", key) != preferred
    table.set_load(preferred, eid, 0, 0, 0.5, 0, 1.0)
    assert table.acquire("m", key) == preferred


def test_affinity_passes_over_a_replica_whose_engine_queues_while_another_can_start_it(
    loaded_table,
):
    table = loaded_table
    key = 12345
    preferred = table.acquire("m", key)
    table.release(preferred)
    eid = table.endpoint_id(preferred)
    others = [slot_of(table, e) for e in "abc" if e != eid]
    # One request waits in its engine (within the load bound: 1 of a model load of 4): a
    # request sent there would wait too, while the others start it at once.
    table.set_load(preferred, eid, 1, 1, 0.1, 0, 1.0)
    for slot in others:
        table.set_load(slot, table.endpoint_id(slot), 0, 1, 0.1, 0, 1.0)
    assert table.acquire("m", key) in others
    table.release(others[0])
    table.release(others[1])
    table.set_load(preferred, eid, 0, 2, 0.1, 0, 1.0)
    assert table.acquire("m", key) == preferred, "its queue emptied: the key's replica again"
    table.release(preferred)
    for slot in others:  # every engine queues: the least loaded, as without a key
        table.set_load(slot, table.endpoint_id(slot), 3, 4, 0.1, 0, 1.0)
    table.set_load(preferred, eid, 1, 4, 0.1, 0, 1.0)
    assert table.acquire("m", key) == preferred


def test_the_in_flight_cap_stays_on_this_routers_own_requests(loaded_table):
    from router.path import fastpath_py

    table = type(loaded_table)(max_in_flight=1)
    table.update({"m": [("a", "http://a")]})
    table.set_load(0, "a", 0, 0, 0.0, 0, 60)
    assert table.acquire("m") == 0
    assert table.acquire("m") == fastpath_py.SATURATED


def test_without_readings_the_pick_is_todays(loaded_table):
    table = loaded_table
    picks = [table.acquire("m") for _ in range(6)]
    assert sorted(picks) == sorted([slot_of(table, e) for e in "abc"] * 2)


@pytest.mark.parametrize("keyed", [0, 12345], ids=["least", "keyed"])
def test_a_replica_full_of_our_requests_is_passed_over_for_one_with_room(fastpath, keyed):
    module = fastpath
    table = module.EndpointTable(max_in_flight=2)
    table.update({"m": [("full", "http://a"), ("room", "http://b")]})
    table._pin_clock(100.0)
    full, room = slot_of(table, "full"), slot_of(table, "room")
    table.release(table.acquire("m"))
    marks = {slot: mark for slot, _, _, mark in table.load_targets(60)}
    # Ours fill `full` to the cap; the engine behind `room` reports another router's queue.
    assert table.set_load(full, "full", 0, 0, 0.1, marks[full], 0.3)
    assert table.set_load(room, "room", 6, 8, 0.1, marks[room], 0.3)
    while table.in_flight(full) < 2:
        slot = table.acquire("m", keyed)
        if slot != full:
            table.release(slot)
    assert table.acquire("m", keyed) == room, "room has room: the request goes there at once"
    while table.in_flight(room) < 2:
        table.acquire("m", keyed)
    assert table.acquire("m", keyed) == module.SATURATED, "every replica at the cap"
    table.update({"m": []})
    assert table.acquire("m") == module.NO_ENDPOINT


def test_the_snapshot_counts_requests_sent_to_each_endpoint_since_it_was_watched(fastpath):
    table = make(fastpath)
    for _ in range(5):
        table.release(table.acquire("llama"))
    assert table.snapshot()["requests"] == {"r1": 3, "r2": 2}, "ties rotate"
    table.update({"llama": [("r1", "http://127.0.0.1:1")]})
    table.update({"llama": [("r1", "http://127.0.0.1:1"), ("r2", "http://127.0.0.1:2")]})
    assert table.snapshot()["requests"] == {"r1": 3, "r2": 0}, "r2 came back: a new slot"

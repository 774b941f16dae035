"""GPU time per model and who it is charged to (controlplane/rules/cost.py)."""

import pytest

from controlplane.rules.cost import (
    FLEET,
    UNALLOCATED,
    GpuMeter,
    allocate,
    card_seconds,
    tokens_by_minute,
)
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice
from tests.controlplane.conftest import as_placed

NODES = {
    "n1": Node("n1", "10.0.0.1", "ib-a", [GPU(i, f"G{i}", "H100-80GB", 81920) for i in range(4)])
}


def spec(name, gpu_memory_mb=None, owner=None, **fields):
    return ModelSpec(name=name, gpu_class="H100-80GB", command=["x"],
                     gpu_memory_mb=gpu_memory_mb, owner=owner, **fields)  # fmt: skip


def replica(rid, model, gpus, state=ReplicaState.READY):
    return Replica(rid, model, [Slice("n1", gpus)], state=state)


def test_a_shared_card_is_split_by_the_memory_each_engine_takes():
    specs = {
        "small": spec("small", 20 * 1024),
        "big": spec("big", 60 * 1024),
        "alone": spec("alone"),
    }
    replicas = [replica("s-1", "small", [0]), replica("b-1", "big", [0]),
                replica("a-1", "alone", [1, 2])]  # fmt: skip
    charged = card_seconds(as_placed(replicas, specs, NODES), specs, NODES, 10.0)
    assert charged["small"][0] == pytest.approx(2.5) and charged["big"][0] == pytest.approx(7.5)
    assert charged["alone"][0] == pytest.approx(20.0), "two cards, ten seconds"
    assert charged[FLEET][0] == pytest.approx(30.0), "three cards hold awake engines"


def test_a_sleeper_is_charged_its_asleep_memory_not_gpu_time():
    specs = {"nap": spec("nap", engine="vllm", sleep_level=1)}
    asleep = as_placed([replica("n-1", "nap", [3], ReplicaState.ASLEEP)], specs, NODES)
    charged = card_seconds(asleep, specs, NODES, 60.0)
    assert charged["nap"] == [0.0, pytest.approx(60.0)], "1 GiB asleep for a minute"
    assert charged[FLEET][0] == 0.0


def test_gpu_time_goes_to_tenants_by_tokens_and_idle_minutes_to_the_owner():
    specs = {"chat": spec("chat", owner="team-a"), "orphan": spec("orphan")}
    replicas = [replica("c-1", "chat", [0]), replica("o-1", "orphan", [1])]
    meter = GpuMeter()
    for second in range(-2, 179, 2):  # three minutes of ticks every 2 s, from 6000
        meter.measure(replicas, specs, NODES, 6000.0 + second)
    usage = [
        (6000.0, {("a", "chat"): [1, 0, 0, 100, 200, 0], ("b", "chat"): [1, 0, 0, 50, 50, 0]}),
        (6060.0, {}),  # nobody asked in the second minute
        (6120.0, {("b", "chat"): [1, 0, 0, 10, 0, 0]}),
    ]
    charged = allocate(meter, tokens_by_minute(usage), 3600.0, 6180.0)
    assert charged[("a", "chat")][0] == pytest.approx(60.0 * 300 / 400, abs=0.5)
    assert charged[("b", "chat")][0] == pytest.approx(60.0 * 100 / 400 + 60.0, abs=0.5)
    assert charged[("team-a", "chat")][0] == pytest.approx(60.0, abs=0.5), "the idle minute"
    assert charged[(UNALLOCATED, "orphan")][0] == pytest.approx(180.0, abs=0.5)
    total = sum(c[0] for c in charged.values())
    fleet = meter.fleet_gpu_seconds(3600.0, 6180.0)
    assert abs(total - fleet) <= 0.01 * fleet and fleet == pytest.approx(360.0, abs=1)


def test_a_paused_leader_does_not_charge_the_gap_and_the_rows_round_trip():
    specs = {"chat": spec("chat")}
    replicas = [replica("c-1", "chat", [0])]
    meter = GpuMeter()
    meter.measure(replicas, specs, NODES, 0.0)
    meter.measure(replicas, specs, NODES, 2.0)
    meter.measure(replicas, specs, NODES, 302.0)  # five minutes without a tick
    meter.measure(replicas, specs, NODES, 304.0)
    assert meter.fleet_gpu_seconds(3600.0, 304.0) == pytest.approx(4.0)
    again = GpuMeter()
    again.load({k: v for k, v in meter.take_dirty_rows().items() if v is not None})
    assert again.fleet_gpu_seconds(3600.0, 304.0) == pytest.approx(4.0)
    assert meter.take_dirty_rows() == {}, "written once"


def test_a_tenant_served_through_an_adapter_is_charged_its_part_of_the_base_s_gpu_time():
    specs = {"chat": spec("chat")}
    replicas = [replica("c-1", "chat", [0])]
    meter = GpuMeter()
    for second in range(-2, 59, 2):  # a minute of ticks every 2 s, from 6000
        meter.measure(replicas, specs, NODES, 6000.0 + second)
    minute = {("a", "chat-sql"): [1, 0, 0, 100, 200, 0], ("b", "chat"): [1, 0, 0, 50, 50, 0]}
    usage = [(6000.0, minute)]
    charged = allocate(meter, tokens_by_minute(usage), 3600.0, 6060.0, {"chat-sql": "chat"})
    assert charged[("a", "chat-sql")][0] == pytest.approx(60.0 * 300 / 400, abs=0.5)
    assert charged[("b", "chat")][0] == pytest.approx(60.0 * 100 / 400, abs=0.5)
    assert not any(tenant == UNALLOCATED for tenant, _ in charged), "nothing left unallocated"


def test_a_closed_minute_is_allocated_once_and_a_window_sums_the_same(monkeypatch):
    import asyncio

    from controlplane.rules import allocations

    specs = {"chat": spec("chat", owner="team-a"), "code": spec("code")}
    replicas = [replica("c-1", "chat", [0]), replica("d-1", "code", [1])]
    meter = GpuMeter()
    for second in range(-2, 600, 2):  # ten minutes of ticks from 6000
        meter.measure(replicas, specs, NODES, 6000.0 + second)
    usage = [(6000.0 + 60 * m, {("a", "chat"): [1, 0, 0, 10 * m, 5, 0],
                                ("b", "code"): [1, 0, 0, 3, m, 0]}) for m in range(10)]  # fmt: skip
    made = []
    real = allocations.allocate_minute
    monkeypatch.setattr(allocations, "allocate_minute",
                        lambda *args: made.append(1) or real(*args))  # fmt: skip
    kept = allocations.Allocations()
    now = 6590.0
    first = asyncio.run(kept.charged(meter, usage, {}, 3600.0, now))
    expected = allocate(meter, tokens_by_minute(usage), 3600.0, now)
    assert first.keys() == expected.keys()
    for key, (gpu_s, gib_s) in expected.items():
        assert first[key] == [pytest.approx(gpu_s), pytest.approx(gib_s)]
    assert len(made) == 10, "each minute once"
    assert asyncio.run(kept.charged(meter, usage, {}, 3600.0, now + 1)) is first, "a read"
    asyncio.run(kept.charged(meter, usage, {}, 3600.0, now + 10))
    assert len(made) == 11, "the nine closed minutes are kept; only the current is made again"
    asyncio.run(kept.charged(meter, usage, {"chat-sql": "chat"}, 3600.0, now + 20))
    assert len(made) == 21, "other adapters' bases: every minute split anew"
    for since in range(60, 6060, 60):  # a caller asking a new window each time
        asyncio.run(kept.charged(meter, usage, {"chat-sql": "chat"}, float(since), now + 30))
    asyncio.run(kept.charged(meter, usage, {"chat-sql": "chat"}, 3600.0, now + 40))
    assert len(kept.answers) == 1, "answers past their time are not kept"

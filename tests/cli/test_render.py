import re

import pytest

from cli.cmd_status import render_status
from cli.cmd_tables import gpus_per_replica, model_table, node_table
from cli.render import bar, duration, idle_text
from controlplane.state.fleet import FleetSnapshot
from controlplane.views.summary import model_rows, node_rows, summary
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_idle_column_tells_unknown_exact_and_lower_bound_apart():
    assert idle_text(-1, "unknown") == "-"
    assert idle_text(720, "exact") == "12m"
    assert idle_text(3600, "at_least") == "≥1h"
    assert idle_text(0, "exact") == "0s"
    assert duration(5400) == "1h30m" and duration(90000) == "1d"


def test_bar_is_proportional():
    assert bar(5, 10, 10) == "[█████·····]"
    assert bar(0, 0, 4) == "[    ]"


def big_fleet(nodes=2000, fabrics=10):
    node_list, replicas, idle = [], [], {}
    for i in range(nodes):
        gpus = [
            GPU(
                j,
                f"u{i}-{j}",
                "H100-80GB" if i % 2 else "A100-80GB",
                healthy=(i * 8 + j) % 997 != 0,
                reason="XID 79",
            )
            for j in range(8)
        ]
        node_list.append(
            Node(f"node-{i:04d}", "10.0.0.1", f"fabric-{i % fabrics}", gpus, ready=i % 400 != 7)
        )
    specs = [
        ModelSpec(name=f"m{k}", gpu_class="H100-80GB", command=["x"], replicas=10)
        for k in range(50)
    ]
    for k in range(500):
        replica = Replica(
            f"m{k % 50}-{k}",
            f"m{k % 50}",
            [Slice(f"node-{(2 * k + 1):04d}", [1, 2])],
            state=ReplicaState.FAILED if k % 97 == 0 else ReplicaState.READY,
            reason="the engine exited with code 1" if k % 97 == 0 else "",
        )
        replicas.append(replica)
        idle[replica.id] = [
            (-1.0, IdleState.UNKNOWN),
            (4000.0, IdleState.EXACT),
            (7200.0, IdleState.AT_LEAST),
        ][k % 3]
    reasons = {
        f"m{k}": f"3 replica(s) of m{k} cannot be placed: needs 8 free H100-80GB GPUs "
        "on one node; the best of 1000 usable node(s) has 6"
        for k in range(20)
    }
    return FleetSnapshot(node_list, replicas, specs, reasons, idle, now=1e6)


def test_status_stays_one_readable_screen_at_2000_nodes():
    text = render_status(summary(big_fleet(), 1800), colour=False)
    lines = text.splitlines()
    assert len(lines) <= 60, "bounded whatever the size of the fleet"
    assert max(len(line) for line in lines) <= 80
    assert "2000 nodes (1995 Ready, 5 NotReady)" in lines[0]
    assert "NOT READY NODES (5)" in text and "FAILED REPLICAS (6)" in text
    assert "… and 6 more fabric/class groups" in text
    assert "UNUSED PAST 30m: 329 replica(s) holding 658 GPU(s)" in text
    assert "165 replica(s) of unknown use, never counted as idle" in text
    assert "≥2h" in text
    assert not ANSI.search(text)


def test_colour_only_when_asked():
    data = summary(big_fleet(40, 2), 1800)
    assert ANSI.search(render_status(data, colour=True))
    assert not ANSI.search(render_status(data, colour=False))


def test_the_fabric_that_decides_an_unplaceable_model_is_always_on_screen():
    # 25 fabrics: 24 of H200 nodes with free whole nodes, one of H100 with a single free node;
    # an H100 model needing 2 whole nodes cannot be placed. Its fabric must be on screen, with
    # its class, however many roomier fabrics of another class there are.
    classes = ["H200-141GB"] * 24 + ["H100-80GB"]
    node_list = []
    for f, gpu_class in enumerate(classes):
        for i in range(80):
            gpus = [GPU(g, f"GPU-{f}-{i}-{g}", gpu_class) for g in range(8)]
            node_list.append(Node(f"n{f:02d}-{i:02d}", "10.0.0.1", f"fab-{f:02d}", gpus))
    held = [
        Replica(f"x-{i}", "x", [Slice(f"n24-{i:02d}", [0])], state=ReplicaState.READY)
        for i in range(79)
    ]
    spec = ModelSpec(
        name="big", gpu_class="H100-80GB", command=["x"], gpus_per_replica=8, nodes_per_replica=2
    )
    other = ModelSpec(name="x", gpu_class="H100-80GB", command=["x"], replicas=79)
    reasons = {"big": "1 replica(s) of big cannot be placed: needs 2 whole free H100-80GB nodes"}
    snap = FleetSnapshot(node_list, held, [spec, other], reasons, {}, now=1e6)
    for width in (80, 200):
        text = render_status(summary(snap, 1800), colour=False, width=width)
        deciding = [line for line in text.splitlines() if line.startswith("fab-24")]
        assert deciding and "H100-80GB" in deciding[0] and deciding[0].split()[-1] == "1"
        assert "more fabric/class groups" in text
        assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("nodes, width", [(4, 80), (4, 200), (2000, 80), (2000, 200)])
def test_tables_fit_the_terminal_and_keep_every_card(nodes, width):
    snap = big_fleet(nodes, 2)
    data = summary(snap, 1800)
    status = render_status(data, colour=False, width=width).splitlines()
    assert max(len(line) for line in status) <= width and len(status) <= 60
    models = model_table(model_rows(snap), wide=False, no_headers=False, width=width)
    assert max(len(line) for line in models.splitlines()) <= width
    reasons = [line for line in models.splitlines() if "needs 8 free" in line]
    assert reasons, "the reason starts with what is missing, not with the model's name again"
    for row in node_rows(snap):
        g = row["gpus"]
        assert g["used"] + g["free"] + g["unhealthy"] + g["unavailable"] == g["total"]
    assert "OTHER" in node_table(node_rows(snap), wide=False, no_headers=False).splitlines()[0]


def test_a_two_node_replica_shows_all_the_cards_it_holds():
    row = {"gpus_per_replica": 8, "nodes_per_replica": 2}
    assert gpus_per_replica(row) == "16 (8x2)"
    assert gpus_per_replica({"gpus_per_replica": 4, "nodes_per_replica": 1}) == "4"


def test_models_at_zero_are_told_apart_from_unplaceable_ones():
    node = Node("n1", "10.0.0.1", "ib-a", [GPU(0, "GPU-0", "H100-80GB")])
    specs = [
        ModelSpec(name=name, gpu_class="H100-80GB", command=["x"], min_replicas=0)
        for name in ("asleep", "waking", "stuck")
    ]
    reasons = {"stuck": "1 replica(s) of stuck cannot be placed: needs 8 free H100-80GB GPUs"}
    snap = FleetSnapshot(
        [node], [], specs, reasons, {}, now=1e6, desired={"asleep": 0}, waiting={"waking": 12}
    )
    data = summary(snap)
    states = {m["name"]: m["state"] for m in model_rows(snap)}
    assert states == {"asleep": "ScaledToZero", "waking": "Waking", "stuck": "Unplaceable"}
    text = render_status(data, colour=False)
    assert (
        "1 scaled to zero, 0 GPU(s) still held (retiring); 1 waking: 12 request(s) waiting" in text
    )
    assert "CANNOT BE PLACED (1)" in text
    table = model_table(model_rows(snap), wide=False, no_headers=True)
    assert table.splitlines()[0].split()[3] == "0/0/0"

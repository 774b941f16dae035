from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.rules.placement import eligible, place
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Schedulable
from tests.controlplane.conftest import node_obj

CLASSES = ["H100-80GB", "A100-80GB"]


def model(gpus=1, nodes=1, gpu_class="H100-80GB"):
    return ModelSpec(
        name="m", gpu_class=gpu_class, command=["x"], gpus_per_replica=gpus, nodes_per_replica=nodes
    )


def test_best_fit_prefers_the_fullest_node_that_fits():
    nodes = [node_obj("a"), node_obj("b")]
    held = {("b", i) for i in range(6)}  # b has 2 free
    outcome = place(model(gpus=2), 1, nodes, held)
    assert [(s.node, s.gpus) for s in outcome.placements[0]] == [("b", [6, 7])]


def test_multi_node_takes_whole_nodes_of_one_fabric():
    nodes = [
        node_obj("a1", "ib-a"),
        node_obj("b1", "ib-b"),
        node_obj("b2", "ib-b"),
        node_obj("a2", "ib-a"),
    ]
    held = {("a2", 0)}
    outcome = place(model(gpus=8, nodes=2), 1, nodes, held)
    assert sorted(s.node for s in outcome.placements[0]) == ["b1", "b2"]
    second = place(model(gpus=8, nodes=2), 2, nodes, held)
    assert len(second.placements) == 1
    assert (
        "needs 2 whole nodes of H100-80GB on one fabric; the best fabric (ib-a) has 1 free"
        in second.reason
    )


def test_reasons_an_operator_can_act_on():
    nodes = [
        node_obj("a", gpus=4),
        node_obj("c", gpus=8, ready=False),
        node_obj("d", schedulable=Schedulable.CORDONED),
    ]
    outcome = place(model(gpus=8), 1, nodes, set())
    assert outcome.reason == (
        "1 replica(s) of m cannot be placed: needs 8 free H100-80GB GPUs "
        "on one node; the best of 1 usable node(s) has 4 (1 NotReady, "
        "1 cordoned or draining)"
    )
    assert (
        "no node has B200-192GB GPUs"
        in place(model(gpu_class="B200-192GB"), 1, nodes, set()).reason
    )


@st.composite
def fleets(draw):
    nodes = []
    for i in range(draw(st.integers(1, 12))):
        gpu_class = draw(st.sampled_from(CLASSES))
        count = draw(st.sampled_from([1, 2, 4, 8]))
        gpus = [
            GPU(j, f"u{i}-{j}", gpu_class, healthy=draw(st.booleans()) or draw(st.booleans()))
            for j in range(count)
        ]
        nodes.append(
            Node(
                name=f"n{i:02d}",
                address="127.0.0.1",
                fabric=draw(st.sampled_from(["f1", "f2", "f3"])),
                gpus=gpus,
                ready=draw(st.booleans()) or draw(st.booleans()),
                schedulable=draw(st.sampled_from(list(Schedulable))),
            )
        )
    held = {(n.name, g.index) for n in nodes for g in n.gpus if draw(st.integers(0, 4)) == 0}
    return nodes, held


@settings(max_examples=300, deadline=None)
@given(
    fleets(),
    st.sampled_from(CLASSES),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 1, 2, 3]),
    st.integers(1, 6),
)
def test_every_placement_keeps_every_rule(fleet, gpu_class, gpus, nodes_per, count):
    nodes, held = fleet
    spec = model(gpus=gpus, nodes=nodes_per, gpu_class=gpu_class)
    by_name = {n.name: n for n in nodes}
    outcome = place(spec, count, nodes, held)
    used = set()
    for placement in outcome.placements:
        assert len(placement) == nodes_per
        assert len({piece.node for piece in placement}) == nodes_per
        if nodes_per > 1:
            assert len({by_name[piece.node].fabric for piece in placement}) == 1
        for piece in placement:
            node = by_name[piece.node]
            assert eligible(node), "never a cordoned, draining or NotReady node"
            assert len(piece.gpus) == gpus
            if nodes_per > 1:
                assert all(
                    g.gpu_class == gpu_class and g.healthy and (node.name, g.index) not in held
                    for g in node.gpus
                ), "multi-node takes whole free nodes"
            for index in piece.gpus:
                gpu = next(g for g in node.gpus if g.index == index)
                assert gpu.gpu_class == gpu_class and gpu.healthy
                assert (node.name, index) not in held and (node.name, index) not in used
                used.add((node.name, index))
    assert bool(outcome.reason) == (len(outcome.placements) < count)


@settings(max_examples=200, deadline=None)
@given(fleets(), st.sampled_from([1, 2, 4]))
def test_single_node_placement_is_best_fit(fleet, gpus):
    nodes, held = fleet
    outcome = place(model(gpus=gpus), 1, nodes, held)
    if not outcome.placements:
        return
    chosen = outcome.placements[0][0].node

    def free(node):
        return sum(
            1
            for g in node.gpus
            if g.gpu_class == "H100-80GB" and g.healthy and (node.name, g.index) not in held
        )

    fits = [free(n) for n in nodes if eligible(n) and free(n) >= gpus]
    assert free(next(n for n in nodes if n.name == chosen)) == min(fits)

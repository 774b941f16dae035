"""The fleet's objects copy and serialise field for field, written out by hand for speed: a
field added to a class and forgotten in its copy or its dict would show here."""

from dataclasses import asdict, fields

from hypothesis import given
from hypothesis import strategies as st

from controlplane.vocabulary.model import (
    GPU,
    ModelSpec,
    Node,
    Replica,
    ReplicaState,
    Schedulable,
    Slice,
)

text = st.text(max_size=8)
gpus = st.builds(GPU, st.integers(0, 15), text, text, st.integers(0, 10**6), st.booleans(), text)
nodes = st.builds(
    Node,
    text,
    text,
    text,
    st.lists(gpus, max_size=4),
    st.dictionaries(text, text, max_size=3),
    st.sampled_from(list(Schedulable)),
    st.booleans(),
    st.floats(0, 1e9),
    st.integers(0, 10**7),
    st.floats(0, 1e3),
)
replicas = st.builds(
    Replica,
    text,
    text,
    st.lists(st.builds(Slice, text, st.lists(st.integers(0, 15), max_size=4)), max_size=3),
    st.sampled_from(list(ReplicaState)),
    text,
    text,
    st.floats(0, 1e9),
    st.floats(0, 1e9),
    st.none() | st.integers(-255, 255),
    text,
    st.floats(0, 1e9),
)


@given(nodes)
def test_a_node_copy_is_equal_and_shares_only_its_gpu_list(node):
    copy = node.copy()
    assert copy == node and copy is not node
    assert copy.gpus is node.gpus, "shared: GPU lists are replaced, never changed in place"
    assert copy.labels is not node.labels


@given(nodes)
def test_a_node_dict_is_what_dataclasses_would_write_less_the_clock(node):
    """Less what only the leader's memory holds: its clock's last heartbeat, and the
    heartbeat period it last told the node."""
    expected = asdict(node)
    expected["schedulable"] = str(node.schedulable)
    del expected["last_heartbeat"], expected["heartbeat_s"]
    assert node.to_dict() == expected
    assert {f.name for f in fields(Node)} - set(node.to_dict()) == {"last_heartbeat", "heartbeat_s"}
    assert Node.from_dict(node.to_dict()) == Node(
        **{**asdict(node), "last_heartbeat": 0.0, "heartbeat_s": 0.0, "gpus": node.gpus}
    )


@given(replicas)
def test_a_replica_copy_and_dict_cover_every_field(replica):
    copy = replica.copy()
    assert copy == replica and copy.placement is not replica.placement
    assert all(a.gpus is not b.gpus for a, b in zip(copy.placement, replica.placement, strict=True))
    assert replica.to_dict() == {**asdict(replica), "state": str(replica.state)}
    assert Replica.from_dict(replica.to_dict()) == replica


def test_a_spec_copy_shares_no_list_or_map():
    spec = ModelSpec(
        "m", "H100", ["vllm", "{port}"], env={"A": "1"}, env_from={"B": {"file": "/x"}}
    )
    copy = spec.copy()
    assert copy == spec
    copy.command.append("x")
    copy.env["A"] = "2"
    copy.env_from["B"]["file"] = "/y"
    assert spec.command == ["vllm", "{port}"] and spec.env == {"A": "1"}
    assert spec.env_from == {"B": {"file": "/x"}}


def test_a_gpu_turning_unhealthy_leaves_an_earlier_snapshot_as_it_was(make_fleet):
    from tests.controlplane.conftest import make_node

    fleet, _ = make_fleet()
    fleet.register(make_node("n1", gpus=2))
    before = fleet.snapshot()
    fleet.heartbeat("n1", {"gpus": [{"index": 1, "healthy": False, "reason": "XID 79"}]})
    after = fleet.snapshot()
    assert [g.healthy for g in before.nodes[0].gpus] == [True, True]
    assert [(g.healthy, g.reason) for g in after.nodes[0].gpus] == [(True, ""), (False, "XID 79")]
    unchanged = fleet.nodes["n1"].gpus
    fleet.heartbeat("n1", {"gpus": [{"index": 1, "healthy": False, "reason": "XID 79"}]})
    assert fleet.nodes["n1"].gpus is unchanged, "no change, no new list"

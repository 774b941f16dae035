import pytest

from sim.fleet import FleetFileError, parse_fleet


def test_fleet_file_shape_and_overrides():
    nodes = parse_fleet(
        {
            "fabrics": [
                {"name": "ib-a", "nodes": 2, "gpu_class": "H100-80GB", "gpus_per_node": 8},
                {"name": "ib-b", "nodes": 1, "gpu_class": "A100-80GB", "gpus_per_node": 4},
            ],
            "nodes": {"ib-a-1": {"unhealthy_gpus": {3: "uncorrectable ECC"}}},
        }
    )
    assert [(n.name, n.fabric, n.gpu_count) for n in nodes] == [
        ("ib-a-0", "ib-a", 8),
        ("ib-a-1", "ib-a", 8),
        ("ib-b-0", "ib-b", 4),
    ]
    assert nodes[1].health()[3] == {"index": 3, "healthy": False, "reason": "uncorrectable ECC"}
    assert nodes[0].describe()["gpus"][0]["gpu_class"] == "H100-80GB"


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "needs `fabrics:`"),
        ({"fabrics": [{"name": "A!", "nodes": 1, "gpu_class": "x", "gpus_per_node": 1}]}, "name"),
        ({"fabrics": [{"name": "a", "nodes": 0, "gpu_class": "x", "gpus_per_node": 1}]}, "nodes"),
        (
            {"fabrics": [{"name": "a", "nodes": 1, "gpu_class": "x", "gpus_per_node": 1, "x": 1}]},
            "unknown key",
        ),
        ({"fabrics": [], "nodes": {"ghost": {}}}, "no such node"),
    ],
)
def test_bad_fleet_files_are_refused(data, message):
    with pytest.raises(FleetFileError, match=message):
        parse_fleet(data)

import pytest

from controlplane.model import SpecError, parse_duration, validate_spec
from tests.controlplane.conftest import spec


def test_a_good_spec_with_defaults():
    parsed = validate_spec(spec(idle_after="15m", replicas=2))
    assert parsed.replicas == 2 and parsed.gpus_per_replica == 1 and parsed.idle_after_s == 900


@pytest.mark.parametrize(
    "change, field",
    [
        ({"name": "Bad Name!"}, "name"),
        ({"name": ""}, "name"),
        ({"replicas": -1}, "replicas"),
        ({"gpus_per_replica": 0}, "gpus_per_replica"),
        ({"nodes_per_replica": "two"}, "nodes_per_replica"),
        ({"command": "vllm serve --port {port}"}, "command"),
        ({"command": []}, "command"),
        ({"command": ["vllm", "{nope}"]}, "command"),
        ({"colour": "blue"}, "colour"),
        ({"env": {"A": 1}}, "env"),
        ({"health_path": "health"}, "health_path"),
        ({"idle_after": "soon"}, "idle_after"),
        ({"gpu_class": None}, "gpu_class"),
    ],
)
def test_bad_specs_name_the_field(change, field):
    with pytest.raises(SpecError) as refused:
        validate_spec({**spec(), **change})
    assert refused.value.field == field


def test_durations():
    assert parse_duration("90s", "x") == 90
    assert parse_duration("2h", "x") == 7200
    assert parse_duration(5, "x") == 5
    with pytest.raises(SpecError):
        parse_duration("0m", "x")

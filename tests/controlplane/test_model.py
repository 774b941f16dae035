import pytest

from controlplane.vocabulary.specs import SpecError, parse_duration, validate_spec
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
        ({"priority": "high"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": False}, "priority"),
        ({"priority": 10**7}, "priority"),
        ({"min_residency": "soon"}, "min_residency"),
        ({"min_residency": -5}, "min_residency"),
        ({"min_residency": "1m", "min_residency_s": 60}, "min_residency"),
    ],
)
def test_bad_specs_name_the_field(change, field):
    with pytest.raises(SpecError) as refused:
        validate_spec({**spec(), **change})
    assert refused.value.field == field


def test_room_fields_default_and_parse():
    plain = validate_spec(spec())
    assert (plain.priority, plain.min_residency_s) == (0, None)
    tuned = validate_spec({**spec(), "priority": -3, "min_residency": "0s"})
    assert (tuned.priority, tuned.min_residency_s) == (-3, 0.0)


def test_durations():
    assert parse_duration("90s", "x") == 90
    assert parse_duration("2h", "x") == 7200
    assert parse_duration(5, "x") == 5
    with pytest.raises(SpecError):
        parse_duration("0m", "x")

"""The example files in docs/ are valid, so that what an operator copies works."""

from pathlib import Path

import yaml

from cli.cmd_apply import read_specs
from controlplane.vocabulary.specs import validate_spec
from sim.fleet import load_fleet

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


def test_example_models_validate():
    specs = [validate_spec(body) for body in read_specs(str(EXAMPLES / "models.yaml"))]
    assert [s.name for s in specs] == ["llama-3.1-8b", "llama-3.1-70b", "deepseek-v3", "demo-chat"]
    assert specs[2].nodes_per_replica == 2


def test_example_llama_cpp_spec_validates():
    (body,) = read_specs(str(EXAMPLES / "llama-cpp.yaml"))
    spec = validate_spec(body)
    assert spec.command[0] == "llama-server" and spec.health_path == "/health"


def test_example_fleet_loads():
    nodes = load_fleet(str(EXAMPLES / "fleet.yaml"))
    assert len(nodes) == 8
    assert nodes[3].health()[5]["healthy"] is False
    assert yaml.safe_load((EXAMPLES / "fleet.yaml").read_text())["fabrics"][0]["name"] == "ib-a"


def test_example_sleep_and_adapters_validate():
    from controlplane.rules.adapters import validate_adapter

    base, *adapters = read_specs(str(EXAMPLES / "sleep-and-adapters.yaml"))
    spec = validate_spec(base)
    assert spec.sleeps and spec.sleep_level == 1 and spec.max_adapters == 8
    names = [validate_adapter(a, {spec.name: spec}).name for a in adapters]
    assert names == ["qwen-sql", "qwen-support-fr"]

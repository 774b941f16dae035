"""docs/grafana-dashboard.json asks only for series that gpufleet exports."""

import json
import re
from pathlib import Path

from controlplane.api.metrics import exposition
from controlplane.state.fleet import FleetSnapshot
from controlplane.views.summary import model_rows, summary
from controlplane.vocabulary.model import GPU, ModelSpec, Node, Replica, ReplicaState, Slice
from router.path import fastpath_py
from router.telemetry.metrics import RouterMetrics, merge, render
from router.tenancy.tenantmetrics import merge_tenants, tenant_lines, tenant_state
from router.tenancy.tenants import TenantState

DASHBOARD = Path(__file__).parent.parent / "docs" / "grafana-dashboard.json"
METRIC = re.compile(r"\b(?:gpufleet|gpurouter)_[a-z_]+")


def exported_names() -> set[str]:
    node = Node("n1", "10.0.0.1", "ib-a", [GPU(0, "GPU-0", "H100-80GB")])
    replica = Replica("m-1", "m", [Slice("n1", [0])], state=ReplicaState.READY)
    spec = ModelSpec(name="m", gpu_class="H100-80GB", command=["x"])
    snap = FleetSnapshot([node], [replica], [spec], {}, {}, now=1e6)
    adapters = [{"name": "a", "base": "m", "loaded": 1, "waiting": 0}]
    stats = {"activity_reports": 0, "ticks": 0, "adapters": adapters,
             "gpu_seconds_last_hour": {("t", "m"): [1.0, 0.0]}}  # fmt: skip
    text = exposition(summary(snap), model_rows(snap), stats)
    metrics = RouterMetrics()
    stats = metrics.model("m")
    stats.finished(200, 0.1)
    stats.first_token.observe(0.05)
    metrics.upstream_error("m", "reset")
    metrics.ejected("m", "r1")
    table = fastpath_py.EndpointTable()
    table.update({"m": [("r1", "http://127.0.0.1:1")]})
    text += render(merge([metrics.state()]), table, []).decode()
    tenant = TenantState("t", 0.0)
    tenant.configure({"requests_per_minute": 60}, None, 0.02, 1)
    tenant.count("m", 200, 1, 1, False, 0.5)
    states = [{"tenants": tenant_state({"t": tenant})}]
    text += tenant_lines(merge_tenants(states, {"t"})).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_every_query_names_an_exported_series():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [
        v["query"]["query"]
        for v in dashboard["templating"]["list"]
        if "query" in v and isinstance(v["query"], dict)
    ]
    asked = {name for expr in exprs for name in METRIC.findall(expr)}
    assert asked, "the dashboard asks for nothing"
    missing = asked - exported_names()
    assert not missing, f"the dashboard asks for series nobody exports: {sorted(missing)}"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])

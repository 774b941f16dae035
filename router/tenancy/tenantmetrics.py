"""Usage per tenant and model in Prometheus text: bounded to the tenants applied and the models
routed (a request for any other model counts under the metrics' catch-all label).

Each worker of a router publishes its counters (`tenant_state`) beside its other metrics
(router/telemetry/metrics.py SharedMetrics); whichever worker answers a scrape renders the sum
of all (`merge_tenants`), so the counters are the process's and never go back between scrapes.
"""

from __future__ import annotations

from router.tenancy.tenants import WAIT_BUCKETS


def tenant_state(tenants: dict) -> dict:
    """{tenant: {"in_flight": n, "usage": {model: [by code, prompt, completion, refused]},
    "waits": {model: [bucket counts, +Inf, sum]}}}, JSON-ready."""
    state = {}
    for name, tenant in tenants.items():
        state[name] = {
            "in_flight": tenant.in_flight,
            "usage": {
                model: [
                    {str(code): n for code, n in row.by_code().items()},
                    row.prompt_tokens,
                    row.completion_tokens,
                    row.rate_limited,
                ]
                for model, row in tenant.usage.items()
            },
            "waits": {model: list(counts) for model, counts in tenant.waits.items()},
        }
    return state


def merge_tenants(states: list[dict], keep) -> dict:
    """The sum of the workers' `tenant_state`s, for the tenants in `keep` (those the answering
    worker holds: a deleted tenant leaves the page as it leaves the table)."""
    merged: dict = {}
    for state in states:
        for name, tenant in state.get("tenants", {}).items():
            if name not in keep:
                continue
            into = merged.setdefault(name, {"in_flight": 0, "usage": {}, "waits": {}})
            into["in_flight"] += tenant["in_flight"]
            for model, (codes, prompt, completion, refused) in tenant["usage"].items():
                row = into["usage"].setdefault(model, [{}, 0.0, 0.0, 0.0])
                for code, n in codes.items():
                    row[0][code] = row[0].get(code, 0) + n
                row[1] += prompt
                row[2] += completion
                row[3] += refused
            for model, counts in tenant["waits"].items():
                have = into["waits"].get(model)
                if have is None:
                    into["waits"][model] = list(counts)
                else:
                    into["waits"][model] = [a + b for a, b in zip(have, counts, strict=True)]
    return merged


def tenant_lines(tenants: dict) -> bytes:
    """`tenants`: merge_tenants' sum."""
    if not tenants:
        return b""
    requests = ["# TYPE gpurouter_tenant_requests_total counter"]
    tokens = ["# TYPE gpurouter_tenant_tokens_total counter"]
    limited = ["# TYPE gpurouter_tenant_rate_limited_total counter"]
    waits = ["# TYPE gpurouter_tenant_queue_wait_seconds histogram"]
    in_flight = ["# TYPE gpurouter_tenant_in_flight_requests gauge"]
    for name in sorted(tenants):
        tenant = tenants[name]
        in_flight.append(
            f'gpurouter_tenant_in_flight_requests{{tenant="{name}"}} {tenant["in_flight"]}'
        )
        for model, (codes, prompt, completion, refused) in sorted(tenant["usage"].items()):
            labels = f'tenant="{name}",model="{model}"'
            for code, count in sorted(codes.items(), key=lambda item: int(item[0])):
                requests.append(
                    f'gpurouter_tenant_requests_total{{{labels},code="{code}"}} {count}'
                )
            for kind, value in (("prompt", prompt), ("completion", completion)):
                series = f'gpurouter_tenant_tokens_total{{{labels},kind="{kind}"}}'
                tokens.append(f"{series} {int(value)}")
            limited.append(f"gpurouter_tenant_rate_limited_total{{{labels}}} {int(refused)}")
        for model, counts in sorted(tenant["waits"].items()):
            labels = f'tenant="{name}",model="{model}"'
            total = 0
            for bound, count in zip(WAIT_BUCKETS, counts, strict=False):
                total += count
                waits.append(
                    f'gpurouter_tenant_queue_wait_seconds_bucket{{{labels},le="{bound}"}} {total}'
                )
            total += counts[len(WAIT_BUCKETS)]
            waits.append(
                f'gpurouter_tenant_queue_wait_seconds_bucket{{{labels},le="+Inf"}} {total}'
            )
            waits.append(f"gpurouter_tenant_queue_wait_seconds_sum{{{labels}}} {counts[-1]:.6f}")
            waits.append(f"gpurouter_tenant_queue_wait_seconds_count{{{labels}}} {total}")
    families = (requests, tokens, limited, waits, in_flight)
    return ("\n".join(line for family in families for line in family) + "\n").encode()

"""Usage per tenant and model in Prometheus text: bounded to the tenants applied and the models
routed (a request for any other model counts under the metrics' catch-all label)."""

from __future__ import annotations

from router.tenants import WAIT_BUCKETS


def tenant_lines(tenants: dict) -> bytes:
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
            f'gpurouter_tenant_in_flight_requests{{tenant="{name}"}} {tenant.in_flight}'
        )
        for model, row in sorted(tenant.usage.items()):
            labels = f'tenant="{name}",model="{model}"'
            for code, count in sorted(row.by_code().items()):
                requests.append(
                    f'gpurouter_tenant_requests_total{{{labels},code="{code}"}} {count}'
                )
            for kind, value in (
                ("prompt", row.prompt_tokens),
                ("completion", row.completion_tokens),
            ):
                series = f'gpurouter_tenant_tokens_total{{{labels},kind="{kind}"}}'
                tokens.append(f"{series} {int(value)}")
            limited.append(
                f"gpurouter_tenant_rate_limited_total{{{labels}}} {int(row.rate_limited)}"
            )
        for model, counts in sorted(tenant.waits.items()):
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

"""Metrics and traces: the Prometheus counters and histograms the request path bumps, and the
OTLP spans, batched off the request path.

May import the rooms below it: `router.protocol`, `router.load`, `router.control`,
`router.tenancy`.
"""

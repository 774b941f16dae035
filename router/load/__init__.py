"""Engine load: reading each engine's own /metrics (queue, running, KV use) into the series
that the request path weighs replicas by.

May import `router.protocol` only.
"""

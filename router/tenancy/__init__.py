"""Tenants: keys, limits and the router's share of each (compiled, in `tenants`), the tenants
file read without a control plane, and the per-tenant counters summed across workers.

May import `router.protocol`, `router.load` and `router.control`.
"""

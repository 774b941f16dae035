"""The node agent: NVML inventory and health, the replica processes it supervises, its client
of the control plane.

A process of its own, beside the control plane's layers: it imports only `vocabulary`, and
meets the server over HTTP, never in memory.
"""

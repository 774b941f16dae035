"""The nouns every layer shares: model specs and records (`model`, `specs`), the closed set of
actions a tick returns, errors, the rules of idle and unknown, roles and credentials, tenants.

Imports nothing else of the control plane.
"""

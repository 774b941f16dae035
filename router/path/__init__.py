"""The request path: accept, read, pick a replica (the compiled endpoint table), relay the
answer, and the parking, affinity and fair queueing around it. The modules here (and the
protocol's readers) are the ones setup.py compiles.

May import every room below it; `router.server` and `router.main`, above it, wire the process.
"""

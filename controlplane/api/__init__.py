"""The HTTP API: handlers by caller (agents, routers, operators, tenants), its plumbing
(auth, leader redirects, errors), paging, /metrics and token files.

Imports any layer below it (`vocabulary`, `rules`, `state`, `views`, `tick`); only
`server.py` imports it.
"""

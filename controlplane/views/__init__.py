"""What operators read, derived from one snapshot: the summary, explain, the fleet's shapes,
and the cache that builds each view once per change off the event loop.

Imports only `vocabulary`, `rules` and `state`.
"""

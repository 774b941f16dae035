"""The fleet's tables and where they are kept: the fleet in memory, the SQLite and PostgreSQL
stores, records a leader acts on, intents from the API, agents' reports, agents' orders,
the leader lease and the published route table.

Imports only `vocabulary` and `rules`.
"""

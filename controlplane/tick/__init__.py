"""One tick: the steps in their written order, the executor that alone changes the fleet during
a tick, the reconciler that runs them, and the term a leader acts with.

Imports only `vocabulary`, `rules`, `state` and `views`.
"""

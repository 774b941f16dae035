"""The control plane: pure Python, in sub-packages by layer.

From the bottom up, each layer imports only the layers below it (tests/controlplane/
test_layers.py holds the picture true):

    vocabulary  the nouns every layer shares: models, specs, actions, errors, idle, auth
    rules       pure decisions over a snapshot: placement, room, autoscale, sleep, adapters
    state       the fleet's tables, both stores, records, intents, reports, orders, the lease
    views       what operators read: the summary, explain, shapes
    tick        one tick: steps, the executor, the reconciler; who leads and acts
    api         the HTTP handlers by caller, auth, paging, /metrics
    server.py   the process: leadership, the tick loop, the API

`agent/` is a process of its own (the node agent) and imports only the vocabulary.
"""

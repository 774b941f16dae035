"""A term that ends is freed when its last user lets go, not by a later full collection: a
new leader's load of 16,000 nodes must not pay for the garbage of the term before it."""

import gc
import weakref

from controlplane.server import Settings, begin_term
from controlplane.state.store import SqliteStore
from tests.controlplane.conftest import make_node, spec


def test_an_ended_term_needs_no_cycle_collection(tmp_path):
    store = SqliteStore(tmp_path / "state.sqlite")
    settings = Settings("127.0.0.1", 0, "sqlite://", {})
    term = begin_term(store, settings)
    term.fleet.register(make_node("n1", gpus=2))
    term.fleet.apply(spec(replicas=1))
    term.reconciler.tick()
    alive = [weakref.ref(o) for o in (term, term.fleet, term.reconciler, term.views)]
    gc.collect()
    gc.disable()
    try:
        del term
        assert [ref() is None for ref in alive] == [True] * len(alive)
    finally:
        gc.enable()
        store.close()

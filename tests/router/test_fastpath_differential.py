"""Random operation sequences give the same choices and snapshots on the extension and the twin."""

from hypothesis import given, settings
from hypothesis import strategies as st

from router.path import _fastpath, fastpath_py

MODELS = ["a", "b", "c"]
ENDPOINT_IDS = [f"r{i}" for i in range(6)]

routes = st.dictionaries(
    st.sampled_from(MODELS),
    st.lists(st.sampled_from(ENDPOINT_IDS), unique=True, max_size=4).map(
        lambda ids: [(i, f"http://127.0.0.1/{i}") for i in ids]
    ),
    max_size=3,
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("update"), routes),
        st.tuples(
            st.just("acquire"),
            st.tuples(
                st.sampled_from(MODELS + ["zz"]),
                st.one_of(st.just(0), st.integers(1, 2**64 - 1)),
                st.lists(st.integers(0, 12), max_size=3).map(tuple),
            ),
        ),
        st.tuples(st.just("release"), st.tuples(st.integers(0, 40), st.booleans())),
        st.tuples(st.just("tick"), st.floats(0, 100)),
        st.tuples(st.just("snapshot"), st.none()),
        st.tuples(
            st.just("reading"),
            st.tuples(
                st.integers(0, 12),
                st.integers(0, 50),
                st.integers(0, 50),
                st.floats(0, 1),
                st.floats(0.1, 3),
            ),
        ),
        st.tuples(st.just("targets"), st.floats(0, 120)),
        st.tuples(st.just("recent"), st.floats(0, 120)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_extension_and_twin_agree(ops):
    tables = [
        m.EndpointTable(failures_to_eject=2, base_ejection_s=5) for m in (_fastpath, fastpath_py)
    ]
    now = 1000.0
    held = [[], []]
    for table in tables:
        table._pin_clock(now)
    for op, arg in ops:
        results = []
        for i, table in enumerate(tables):
            if op == "update":
                table.update(arg)
                results.append(table.version)
            elif op == "acquire":
                model, key, exclude = arg
                slot = table.acquire(model, key, exclude)
                if slot >= 0:
                    held[i].append(slot)
                results.append(slot)
            elif op == "release":
                index, failed = arg
                if held[i]:
                    slot = held[i].pop(index % len(held[i]))
                    results.append((slot, table.release(slot, failed=failed)))
            elif op == "tick":
                table._pin_clock(now + arg)
            elif op == "reading":
                slot, waiting, running, kv_use, valid_s = arg
                try:
                    endpoint = table.endpoint_id(slot)
                except IndexError:
                    endpoint = None
                marks = {t[0]: t[3] for t in table.load_targets(1e9)}
                taken = table.set_load(
                    slot, str(endpoint), waiting, running, kv_use, marks.get(slot, 0), valid_s
                )
                results.append((taken, table.load_of(slot)))
            elif op == "targets":
                results.append(table.load_targets(arg))
            elif op == "recent":
                recent = table.recent_models(arg)
                targets = {t[0] for t in table.load_targets(arg)}
                names = {
                    model
                    for model in table.models()
                    if any(slot in targets for slot, _, _ in table.endpoints(model))
                }
                assert set(recent) == names, (recent, names)
                results.append(recent)
            else:
                results.append(table.snapshot())
        if op == "tick":
            now += arg
        assert results[0:1] == results[1:2], (op, arg)
    for table in tables:
        table._pin_clock(now)
    assert tables[0].snapshot() == tables[1].snapshot()

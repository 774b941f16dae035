"""Random operation sequences give the same choices and snapshots on the extension and the twin."""

from hypothesis import given, settings
from hypothesis import strategies as st

from router import _fastpath, fastpath_py

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
            else:
                results.append(table.snapshot())
        if op == "tick":
            now += arg
        assert results[0:1] == results[1:2], (op, arg)
    for table in tables:
        table._pin_clock(now)
    assert tables[0].snapshot() == tables[1].snapshot()

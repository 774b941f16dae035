"""Lists a page at a time: every row once, in order, whatever the page size."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.api.paging import MAX_LIMIT, BadPage, page, token_after


def by_name(row):
    return (row["name"],)


def walk(rows, limit):
    seen, token, pages = [], None, 0
    while True:
        chosen, metadata = page(rows, by_name, str(limit), token)
        seen += chosen
        pages += 1
        token = metadata.get("continue")
        if token is None:
            return seen, pages
        assert metadata["remaining"] == len(rows) - len(seen)


@given(st.sets(st.text(min_size=1, max_size=6), max_size=40), st.integers(1, 12))
def test_pages_list_every_row_once_in_order(names, limit):
    rows = [{"name": n} for n in sorted(names)]
    seen, pages = walk(rows, limit)
    assert seen == rows
    assert pages == max(1, -(-len(rows) // limit))


def test_without_a_limit_the_list_comes_whole():
    rows = [{"name": f"n{i}"} for i in range(5)]
    assert page(rows, by_name, None, None) == (rows, {})


def test_a_row_removed_behind_the_cursor_moves_nothing_and_none_is_listed_twice():
    rows = [{"name": f"n{i}"} for i in range(6)]
    first, metadata = page(rows, by_name, "3", None)
    later = [r for r in rows if r["name"] != "n1"] + [{"name": "n0a"}]
    later.sort(key=by_name)
    rest, _ = page(later, by_name, "10", metadata["continue"])
    assert [r["name"] for r in first + rest] == ["n0", "n1", "n2", "n3", "n4", "n5"]


@pytest.mark.parametrize("limit", ["0", "-1", "x", "1.5", str(MAX_LIMIT + 1)])
def test_a_bad_limit_is_refused_by_name(limit):
    with pytest.raises(BadPage) as refused:
        page([], by_name, limit, None)
    assert refused.value.field == "limit" and str(MAX_LIMIT) in refused.value.message


@pytest.mark.parametrize("token", ["%%%", "bm9wZQ", token_after((1,)).replace("W", "e")])
def test_a_token_this_server_did_not_give_is_refused(token):
    with pytest.raises(BadPage) as refused:
        page([{"name": "a"}], by_name, "1", token)
    assert refused.value.field == "continue"

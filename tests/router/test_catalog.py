"""What `/v1/models` is built from: each replica's own list, asked every refresh until it
comes back the same, then every QUIET_EVERY refreshes; a name nobody serves has the next
refresh ask every replica."""

import asyncio

import pytest

from router.control import catalog as catalog_module
from router.control.catalog import QUIET_AFTER, QUIET_EVERY, ModelCatalog
from router.path import _fastpath


class Replicas:
    """What each replica URL lists, and how often each was asked."""

    def __init__(self, lists: dict[str, list]) -> None:
        self.lists = lists
        self.asked: dict[str, int] = dict.fromkeys(lists, 0)

    async def ask(self, session, url: str, timeout_s: float):
        self.asked[url] += 1
        return self.lists[url]


@pytest.fixture
def replicas(monkeypatch):
    found = Replicas(
        {
            "http://a": [{"id": "llama"}, {"id": "sql-lora", "parent": "llama"}],
            "http://b": [{"id": "llama"}],
        }
    )
    monkeypatch.setattr(catalog_module.ModelCatalog, "_ask", staticmethod(found.ask))
    return found


def table_of(urls: list[str]):
    table = _fastpath.EndpointTable()
    table.update({"llama": [(f"r{i}", url) for i, url in enumerate(urls)]})
    return table


def refresh(catalog: ModelCatalog, table, times: int = 1) -> None:
    for _ in range(times):
        asyncio.run(catalog.refresh(None, table))


def test_a_replica_whose_list_stays_the_same_is_asked_ever_less_often(replicas):
    catalog, table = ModelCatalog(), table_of(["http://a", "http://b"])
    refresh(catalog, table, QUIET_AFTER + 1)
    assert replicas.asked == {"http://a": QUIET_AFTER + 1, "http://b": QUIET_AFTER + 1}
    refresh(catalog, table, QUIET_EVERY)
    assert replicas.asked["http://a"] == QUIET_AFTER + 2, "once in QUIET_EVERY refreshes"
    assert catalog.alias_of("sql-lora") == "llama", "what it said last stands meanwhile"


def test_a_changed_list_is_seen_at_its_next_ask_and_asked_every_refresh_again(replicas):
    catalog, table = ModelCatalog(), table_of(["http://a", "http://b"])
    refresh(catalog, table, QUIET_AFTER + 1)
    replicas.lists["http://b"] = [{"id": "llama"}, {"id": "chat-lora", "parent": "llama"}]
    for _ in range(QUIET_EVERY):
        refresh(catalog, table)
        if "chat-lora" in catalog.aliases:
            break
    assert catalog.aliases == {"sql-lora": "llama", "chat-lora": "llama"}
    asked = replicas.asked["http://b"]
    refresh(catalog, table)
    assert replicas.asked["http://b"] == asked + 1, "a list that changed is asked again at once"


def test_a_name_nobody_serves_has_the_next_refresh_ask_every_replica(replicas):
    catalog, table = ModelCatalog(), table_of(["http://a", "http://b"])
    refresh(catalog, table, QUIET_AFTER + 2)
    replicas.lists["http://b"] = [{"id": "llama"}, {"id": "new-lora", "parent": "llama"}]
    assert catalog.alias_of("new-lora") is None  # a client asks for it: not known yet
    before = dict(replicas.asked)
    refresh(catalog, table)
    assert {url: n - before[url] for url, n in replicas.asked.items()} == {
        "http://a": 1,
        "http://b": 1,
    }
    assert catalog.alias_of("new-lora") == "llama"


def test_a_replica_that_does_not_answer_keeps_what_it_said_and_is_asked_again(replicas):
    catalog, table = ModelCatalog(), table_of(["http://a", "http://b"])
    refresh(catalog, table, QUIET_AFTER + 1)
    replicas.lists["http://a"] = None  # no answer in time
    catalog.ask_all = True
    refresh(catalog, table)
    assert catalog.alias_of("sql-lora") == "llama"
    asked = replicas.asked["http://a"]
    refresh(catalog, table)
    assert replicas.asked["http://a"] == asked + 1


def test_a_replica_gone_from_the_table_is_forgotten(replicas):
    catalog = ModelCatalog()
    refresh(catalog, table_of(["http://a", "http://b"]))
    assert catalog.alias_of("sql-lora") == "llama"
    refresh(catalog, table_of(["http://b"]))
    assert catalog.aliases == {} and list(catalog.answers) == [("llama", "http://b")]

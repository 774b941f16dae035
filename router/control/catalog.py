"""What `/v1/models` answers: the table's models, merged with what the replicas serve.

Engines list more than the name they were started with: vLLM lists each LoRA adapter loaded
on it as a model of its own (with `parent`), and a request naming the adapter must reach a
replica of its base model. Once a tick the router asks each replica's `/v1/models`; a name a
replica lists besides its own model becomes an alias of that model.

A replica whose list came back the same QUIET_AFTER times running is quiet: it is asked every
QUIET_EVERY refreshes (a minute at the router's 10 s), not every one. At 1,000 replicas the
router otherwise spent 0.3 s of a core every 10 s asking them all. A request that names a model
neither in the table nor an alias has the next refresh ask every replica, quiet or not, so an
adapter loaded on a quiet engine is known at most one refresh after the first request for it.
"""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp

from router.control.resolvers import served

log = logging.getLogger("gpurouter.catalog")

QUIET_AFTER = 2
QUIET_EVERY = 6


class ModelCatalog:
    def __init__(self) -> None:
        self.reported: dict[str, dict[str, dict]] = {}  # model -> {card id: card}
        self.aliases: dict[str, str] = {}  # served name -> model in the table
        # (model, replica URL) -> [its last cards, times running they came back the same,
        # the refresh it was last asked in]
        self.answers: dict[tuple[str, str], list] = {}
        self.refreshes = 0
        self.ask_all = False

    def cards(self, table_models: list[str]) -> list[dict]:
        cards = []
        for model in table_models:
            own = self.reported.get(model, {})
            base = own.get(model) or {"id": model, "object": "model", "created": 0}
            cards.append({**base, "owned_by": "gpufleet"})
            for card_id, card in own.items():
                if card_id != model:
                    cards.append({**card, "parent": card.get("parent") or model})
        return cards

    def alias_of(self, name: str) -> str | None:
        alias = self.aliases.get(name)
        if alias is None:
            self.ask_all = True  # perhaps loaded on a quiet replica since it was last asked
        return alias

    def take(self, model: str, cards: list[dict]) -> None:
        """Cards one replica of `model` reported."""
        seen = self.reported.setdefault(model, {})
        for card in cards:
            if isinstance(card, dict) and isinstance(card.get("id"), str) and card["id"]:
                seen[card["id"]] = card

    def rebuild_aliases(self, table_models: list[str]) -> None:
        known = set(table_models)
        self.reported = {m: cards for m, cards in self.reported.items() if m in known}
        self.aliases = {
            card_id: model
            for model, cards in self.reported.items()
            for card_id in cards
            if card_id not in known
        }

    async def refresh(self, session: aiohttp.ClientSession, table, timeout_s: float = 2.0):
        """Ask the replicas in the table that are due for their models; one that does not
        answer in time keeps what it said last."""
        self.refreshes += 1
        ask_all, self.ask_all = self.ask_all, False
        models = served(table.models())
        pairs = [(model, url) for model in models for _, _, url in table.endpoints(model)]
        due = [pair for pair in pairs if ask_all or self._due(pair)]
        said = await asyncio.gather(*(self._ask(session, url, timeout_s) for _, url in due))
        for pair, cards in zip(due, said, strict=True):
            self._note(pair, cards)
        live = set(pairs)
        self.answers = {pair: answer for pair, answer in self.answers.items() if pair in live}
        self.reported = {}
        for (model, _), (cards, _, _) in self.answers.items():
            self.take(model, cards)
        self.rebuild_aliases(models)

    def _due(self, pair: tuple[str, str]) -> bool:
        answer = self.answers.get(pair)
        if answer is None or answer[1] < QUIET_AFTER:
            return True
        return self.refreshes - answer[2] >= QUIET_EVERY

    def _note(self, pair: tuple[str, str], cards: list | None) -> None:
        answer = self.answers.get(pair)
        if cards is None:  # no answer: what it said last stands, and it is asked next time
            if answer is not None:
                answer[1], answer[2] = 0, self.refreshes
            return
        same = answer[1] + 1 if answer is not None and answer[0] == cards else 0
        asked_in = self.refreshes
        if same == QUIET_AFTER:  # quiet from now: asked at a phase of its own, not all at once
            asked_in -= random.randrange(QUIET_EVERY)
        self.answers[pair] = [cards, same, asked_in]

    @staticmethod
    async def _ask(session, url: str, timeout_s: float) -> list | None:
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with session.get(url + "/v1/models", timeout=timeout) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        data = body.get("data") if isinstance(body, dict) else None
        return data if isinstance(data, list) else None

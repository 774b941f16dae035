"""What `/v1/models` answers: the table's models, merged with what the replicas serve.

Engines list more than the name they were started with: vLLM lists each LoRA adapter loaded
on it as a model of its own (with `parent`), and a request naming the adapter must reach a
replica of its base model. Once a tick the router asks each replica's `/v1/models`; a name a
replica lists besides its own model becomes an alias of that model.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from router.control.resolvers import served

log = logging.getLogger("gpurouter.catalog")


class ModelCatalog:
    def __init__(self) -> None:
        self.reported: dict[str, dict[str, dict]] = {}  # model -> {card id: card}
        self.aliases: dict[str, str] = {}  # served name -> model in the table

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
        return self.aliases.get(name)

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
        """Ask every replica in the table for its models; one that does not answer in time
        keeps what it said last."""
        models = served(table.models())
        fresh = ModelCatalog()
        jobs = [
            self._ask(session, model, url, timeout_s, fresh)
            for model in models
            for _, _, url in table.endpoints(model)
        ]
        await asyncio.gather(*jobs)
        for model in models:
            if model not in fresh.reported and model in self.reported:
                fresh.reported[model] = self.reported[model]
        self.reported = fresh.reported
        self.rebuild_aliases(models)

    @staticmethod
    async def _ask(session, model: str, url: str, timeout_s: float, into: ModelCatalog):
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with session.get(url + "/v1/models", timeout=timeout) as resp:
                if resp.status != 200:
                    return
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        data = body.get("data") if isinstance(body, dict) else None
        if isinstance(data, list):
            into.take(model, data)

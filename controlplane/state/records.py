"""What the leader acts on between ticks, kept as records so that a restart or a new leader
carries on where the old one stopped: GPUs kept for a waiting model (with the time they were
kept from, so that they expire), when requests began and last said they wait, when a model
was woken, and how many swaps, sleeps and wakes each model had.

The fleet holds them in dicts and writes what changed once a tick (`ModelRecords.flush`), as
it does routers' activity; a record is one row per model and kind, its body JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from controlplane.rules.adapters import Adapter
from controlplane.vocabulary.model import Slice
from controlplane.vocabulary.tenants import Tenant, TenantKey


@dataclass
class Reservation:
    """GPUs kept for a waiting model while the replicas on them stop: nothing else is placed
    there, nothing wakes them, until the model is placed on them."""

    model: str
    placement: list  # the Slices it will be placed on
    victims: list[str]  # replica ids stopping to free them
    since: float  # wall clock: when requests began to wait for the model
    made_at: float = 0.0  # wall clock: when the victims were chosen
    wake: str = ""  # a sleeper of the model to wake there, instead of placing a new replica

    def gpus(self) -> set[tuple[str, int]]:
        return {(piece.node, index) for piece in self.placement for index in piece.gpus}

    def nodes(self) -> list[str]:
        return [piece.node for piece in self.placement]

    def to_dict(self) -> dict:
        return {
            "placement": [{"node": p.node, "gpus": list(p.gpus)} for p in self.placement],
            "victims": list(self.victims),
            "since": self.since,
            "made_at": self.made_at,
            "wake": self.wake,
        }

    @classmethod
    def from_dict(cls, model: str, body: dict) -> Reservation:
        placement = [Slice(p["node"], list(p["gpus"])) for p in body["placement"]]
        return cls(
            model,
            placement,
            list(body["victims"]),
            body["since"],
            body["made_at"],
            body.get("wake", ""),
        )


class ModelRecords:
    """The per-model state a leader acts on, as rows `KIND/MODEL` -> JSON."""

    KINDS = (
        "reservation",
        "demand_since",
        "demanded_at",
        "woken_at",
        "swaps",
        "sleeps",
        "wakes",
        "adapter",  # an operator's adapter object, kept here as one row each
        "adapter_loads",
        "adapter_unloads",
        "adapter_resolved",  # loads an engine's resolver made itself, per adapter
        "tenant",  # an operator's tenant, one row each
        "tenant_key",  # a tenant's key, as its digest: key id -> TenantKey
        "setting",  # the fleet's own settings: "auth" ("tenants" once a tenant was applied)
    )
    PARSERS = {
        "reservation": Reservation.from_dict,
        "adapter": lambda _, v: Adapter.from_dict(v),
        "tenant": lambda _, v: Tenant.from_dict(v),
        "tenant_key": lambda _, v: TenantKey.from_dict(v),
    }

    def __init__(self, rows: dict[str, bytes]) -> None:
        self.stored = dict(rows)  # what the store holds, as last written

    def loaded(self) -> dict[str, dict]:
        """kind -> {model: value} from the stored rows."""
        found: dict[str, dict] = {kind: {} for kind in self.KINDS}
        for key, body in self.stored.items():
            kind, _, model = key.partition("/")
            if kind not in found:
                continue  # written by a newer gpufleet: not ours to read
            value = orjson.loads(body)
            parse = self.PARSERS.get(kind)
            found[kind][model] = parse(model, value) if parse else value
        return found

    def flush(self, store, current: dict[str, dict]) -> None:
        """Write the rows that changed since the last flush, and delete those that went.
        `current`: kind -> {model: value} as the fleet holds it now."""
        rows = {}
        for kind, values in current.items():
            for model, value in values.items():
                body = value.to_dict() if hasattr(value, "to_dict") else value
                rows[f"{kind}/{model}"] = orjson.dumps(body)
        with store.batch():
            for key, body in rows.items():
                if self.stored.get(key) != body:
                    store.put_record(key, body)
            for key in self.stored.keys() - rows.keys():
                if key.partition("/")[0] in current:  # rows of other kinds are not its own
                    store.put_record(key, None)
        self.stored = {k: v for k, v in self.stored.items() if k.partition("/")[0] not in current}
        self.stored.update(rows)

"""What operators ask of the fleet: specs, adapters, scales, nodes' operator states, demand.

Each call validates first, writes to the store, then changes memory: what fails validation
changes nothing, and what was acknowledged survives a restart. A call records intent (a spec,
a count, a drain, a demand); it changes no replica: the next tick's steps read it and decide
(controlplane/tick/steps/). `gpuctl stop-idle`, an operator's word to stop at once, is planned
as a step is and carried out by the executor (controlplane/rules/scaling.py).
"""

from __future__ import annotations

from controlplane.rules.adapters import Adapter, validate_adapter
from controlplane.vocabulary.auth import new_credential
from controlplane.vocabulary.errors import BadRequest, Conflict, NotFound
from controlplane.vocabulary.model import ModelSpec, Node, Schedulable
from controlplane.vocabulary.redact import keep_stored
from controlplane.vocabulary.specs import SpecError, validate_spec


class Intents:
    """Mixed into Fleet: the calls that record what operators and routers ask for."""

    def apply(self, body, dry_run: bool = False) -> tuple[ModelSpec, str]:
        """Create or update a model; returns the stored spec and created/configured/unchanged.
        `dry_run`: validate and say what would happen, store nothing."""
        try:
            named = body.get("name") if isinstance(body, dict) else None
            body = keep_stored(body, self.specs.get(named) if isinstance(named, str) else None)
            spec = validate_spec(body)
        except SpecError as exc:
            raise BadRequest(exc.field, exc.message) from None
        if spec.name in self.adapters:
            raise BadRequest(
                "name", f"an adapter is named {spec.name}: requests name one or the other"
            )
        self._check_fits_a_card(spec)
        current = self.specs.get(spec.name)
        outcome = next_generation("model", spec, current, body)
        if outcome == "unchanged":
            return current, outcome
        if dry_run:
            return spec, outcome
        self.store.put_spec(spec)
        self.specs[spec.name] = spec
        self.leaving_specs.pop(spec.name, None)
        if spec.autoscaled and current is not None and current.autoscaled:
            # An edit of an autoscaled model keeps what its load asked for, within the new
            # bounds: resetting it to `replicas` would stop replicas that are serving.
            kept = self.scaled.get(spec.name)
            if kept is not None:
                self.set_scaled(spec.name, min(max(kept, spec.floor), spec.ceiling))
        else:
            self.set_scaled(spec.name, None)
        self.changed = True
        self.event(spec.name, f"spec {outcome} (generation {spec.generation})")
        return spec, outcome

    def _check_fits_a_card(self, spec: ModelSpec) -> None:
        """A `gpu_memory` larger than every known card of its class can never be placed."""
        if spec.gpu_memory_mb is None:
            return
        sizes = [g.memory_mb for n in self.nodes.values() for g in n.gpus
                 if g.gpu_class == spec.gpu_class and g.memory_mb > 0]  # fmt: skip
        if sizes and spec.gpu_memory_mb > max(sizes):
            raise BadRequest(
                "gpu_memory",
                f"{spec.gpu_memory_mb} MiB is more than a {spec.gpu_class} card holds "
                f"({max(sizes)} MiB)",
            )

    def delete(self, name: str) -> ModelSpec:
        spec = self.spec(name)
        riding = sorted(a.name for a in self.adapters.values() if a.base == name)
        if riding:
            raise Conflict(
                f"adapters use model {name} as their base ({', '.join(riding[:5])}"
                + (f" and {len(riding) - 5} more" if len(riding) > 5 else "")
                + "): delete them first"
            )
        self.store.delete_spec(name)
        del self.specs[name]
        if self.of_model.get(name):
            # Its replicas stop through the safe stop: their agents run them on this spec till
            # then (kept in memory only: a restarted leader lets them go at once).
            self.leaving_specs[name] = spec
        self.reasons.pop(name, None)
        self.events.pop(name, None)
        self.scaled.pop(name, None)
        self.reservations.pop(name, None)
        self.room.pop(name, None)
        self.windows.pop(name, None)
        self.autoscale.pop(name, None)
        self.demand_since.pop(name, None)
        self.demanded_at.pop(name, None)
        self.woken_at.pop(name, None)
        self.swap_totals.pop(name, None)
        self.sleep_totals.pop(name, None)
        self.wake_totals.pop(name, None)
        self.changed = True
        return spec

    def scale(self, name: str, replicas, generation=None) -> ModelSpec:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise BadRequest("replicas", "must be a non-negative integer")
        spec = self.spec(name)
        if generation and generation != spec.generation:
            raise Conflict(f"model {name} is at generation {spec.generation}, not {generation}")
        if spec.autoscaled and not spec.floor <= replicas <= spec.ceiling:
            raise BadRequest(
                "replicas",
                f"model {name} autoscales between min_replicas {spec.floor} and max_replicas"
                f" {spec.ceiling}: scale it within them (the point it starts from), or apply"
                " new bounds",
            )
        if spec.replicas == replicas:
            # The operator's count again, wherever load or idleness took it: a model scaled to
            # zero by idleness starts again.
            if name in self.scaled:
                self.set_scaled(name, None)
                self.event(name, f"scaled to {replicas} replica(s)")
            return spec
        updated = ModelSpec(
            **{**spec.to_dict(), "replicas": replicas, "generation": spec.generation + 1}
        )
        self.store.put_spec(updated)
        self.specs[name] = updated
        self.set_scaled(name, None)
        self.changed = True
        self.event(name, f"scaled from {spec.replicas} to {replicas} replica(s)")
        return updated

    def spec(self, name: str) -> ModelSpec:
        try:
            return self.specs[name]
        except KeyError:
            raise NotFound(f"model {name} not found") from None

    def apply_adapter(self, body, dry_run: bool = False) -> tuple[Adapter, str]:
        """Create or update an adapter; stored before the answer. Nothing restarts: its
        holders load it again from a new source once the old one is unloaded."""
        try:
            adapter = validate_adapter(body, self.specs)
        except SpecError as exc:
            raise BadRequest(exc.field, exc.message) from None
        current = self.adapters.get(adapter.name)
        outcome = next_generation("adapter", adapter, current, body)
        if outcome == "unchanged":
            return current, outcome
        if dry_run:
            return adapter, outcome
        if current is not None and (current.source, current.base) != (adapter.source, adapter.base):
            # Loaded from the old source, or on the old base: unloaded, then loaded anew.
            for replica in self.replicas.values():
                if adapter.name in replica.want_adapters:
                    self.unload_adapter(replica, adapter.name, "its source or base changed")
        for replica in self.replicas.values():
            if adapter.name in replica.adapter_failures:  # applied again: worth a new try
                replica.adapter_failures = {
                    k: v for k, v in replica.adapter_failures.items() if k != adapter.name
                }
                self.put_replica(replica)
        self.adapters[adapter.name] = adapter
        self.flush_records()
        self.changed = True
        self.event(adapter.name, f"adapter {outcome} (generation {adapter.generation})")
        return adapter, outcome

    def adapter(self, name: str) -> Adapter:
        try:
            return self.adapters[name]
        except KeyError:
            raise NotFound(f"adapter {name} not found") from None

    def delete_adapter(self, name: str) -> Adapter:
        """Gone from the routes now; each holder unloads it once its routers have dropped it."""
        adapter = self.adapter(name)
        del self.adapters[name]
        for replica in self.replicas.values():
            if name in replica.want_adapters:
                self.unload_adapter(replica, name, "adapter deleted")
        for kept in (self.adapter_loads, self.adapter_unloads, self.adapter_resolved,
                     self.demand_since, self.demanded_at):  # fmt: skip
            kept.pop(name, None)
        self.adapter_reasons.pop(name, None)
        self.events.pop(name, None)
        self.flush_records()
        self.changed = True
        return adapter

    def adapter_demand(self, name: str, waiting: int) -> Adapter:
        adapter = self.adapter(name)
        if waiting > 0:
            now = self.wall()
            self.demanded_at[name] = now
            self.demand_since.setdefault(name, now)
        return adapter

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise NotFound(f"node {name} not found") from None

    def issue_credential(self, name: str) -> str:
        """A new credential bound to node `name`: returned once, kept as its digest."""
        token, kept = new_credential()
        self.keep_credential(name, kept)
        return token

    def keep_credential(self, name: str, kept: str) -> None:
        """Bind the credential whose SHA-256 is `kept` to node `name`."""
        self.store.put_credential(name, kept)
        self.credentials[name] = kept

    def delete_node(self, name: str) -> Node:
        """An operator removes a node: its credential is revoked (the agent, if it still runs,
        is refused from now on); the next tick fails its replicas, and their models place
        others (controlplane/tick/steps/nodes.py)."""
        node = self.node(name)
        self.store.delete_node(name)
        del self.nodes[name]
        self.credentials.pop(name)
        self.orders.touched((name,))  # its watch hears it is gone
        self.changed = True
        return node

    def set_schedulable(self, name: str, state: Schedulable) -> Node:
        node = self.node(name)
        if node.schedulable != state:
            node.schedulable = state
            self.store.put_node(node)
            self.changed = True
        return node

    def demand(self, model: str, waiting: int) -> ModelSpec:
        """A router holds `waiting` requests for `model`, which has no ready replica: kept as
        a record; the next tick wakes a model at zero (controlplane/tick/steps/models.py)."""
        spec = self.spec(model)
        if waiting > 0:
            now = self.wall()
            self.demanded_at[model] = now
            self.demand_since.setdefault(model, now)
            self.changed = True
        return spec


def next_generation(kind: str, new, current, body) -> str:
    """Give `new` (a spec or an adapter) the generation after `current` (None: it is created)
    and say what applying it does: created, configured or unchanged. Conflict when the change
    was made against another generation than the stored one."""
    expected = body.get("generation") if isinstance(body, dict) else None
    if expected and current is not None and expected != current.generation:
        raise Conflict(
            f"{kind} {new.name} is at generation {current.generation}, the "
            f"change was made against {expected}: read it again and re-apply"
        )
    if expected and current is None:
        raise Conflict(f"{kind} {new.name} does not exist any more (deleted meanwhile)")
    if current is not None:
        new.generation = current.generation
        if new.to_dict() == current.to_dict():
            return "unchanged"
    new.generation = (current.generation if current else 0) + 1
    return "configured" if current else "created"

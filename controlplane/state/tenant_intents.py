"""What operators ask of tenants: apply, delete, make and revoke keys. Mixed into Fleet.

As every intent: validated first, stored before the answer, then held in memory. A change
reaches routers with the next routing table (the tick after it): a revoked key, or a deleted
tenant's, is refused by every router within one route version.
"""

from __future__ import annotations

from controlplane.state.intents import next_generation
from controlplane.vocabulary.errors import BadRequest, NotFound
from controlplane.vocabulary.specs import SpecError
from controlplane.vocabulary.tenants import Tenant, TenantKey, new_key, validate_tenant

KEYS_PER_TENANT = 100  # enough to rotate; more is a leak nobody will audit


class TenantIntents:
    def apply_tenant(self, body, dry_run: bool = False) -> tuple[Tenant, str]:
        try:
            tenant = validate_tenant(body)
        except SpecError as exc:
            raise BadRequest(exc.field, exc.message) from None
        current = self.tenants.get(tenant.name)
        outcome = next_generation("tenant", tenant, current, body)
        if outcome == "unchanged":
            return current, outcome
        if dry_run:
            return tenant, outcome
        self.tenants[tenant.name] = tenant
        self.settings["auth"] = "tenants"  # for good: deleting the last one opens nothing
        self.flush_records()
        self.changed = True
        self.event(tenant.name, f"tenant {outcome} (generation {tenant.generation})")
        return tenant, outcome

    def tenant(self, name: str) -> Tenant:
        try:
            return self.tenants[name]
        except KeyError:
            raise NotFound(f"tenant {name} not found") from None

    def delete_tenant(self, name: str) -> Tenant:
        """Gone with its keys: requests already admitted finish, new ones are refused."""
        tenant = self.tenant(name)
        del self.tenants[name]
        for key_id in [k.id for k in self.tenant_keys.values() if k.tenant == name]:
            del self.tenant_keys[key_id]
        self.ledger.forget_tenant(name)
        self.events.pop(name, None)
        self.flush_records()
        self.changed = True
        return tenant

    def create_key(self, name: str) -> tuple[str, TenantKey]:
        tenant = self.tenant(name)
        if sum(1 for k in self.tenant_keys.values() if k.tenant == name) >= KEYS_PER_TENANT:
            raise BadRequest(
                "tenant", f"tenant {name} has {KEYS_PER_TENANT} keys: revoke one first"
            )
        key, kept = new_key(tenant.name, self.wall())
        self.tenant_keys[kept.id] = kept
        self.flush_records()
        self.changed = True
        return key, kept

    def revoke_key(self, key_id: str) -> TenantKey:
        kept = self.tenant_keys.pop(key_id, None)
        if kept is None:
            raise NotFound(f"key {key_id} not found")
        self.flush_records()
        self.changed = True
        return kept

    def note_keys_used(self) -> None:
        """Carry the routers' last-used times onto the keys (to the minute: a key in use is
        not written again every tick)."""
        for key_id, at in self.ledger.keys_used.items():
            kept = self.tenant_keys.get(key_id)
            if kept is not None:
                at = float(int(at // 60 * 60))
                if kept.last_used is None or at > kept.last_used:
                    kept.last_used = at

    def tenant_rows(self) -> list[dict]:
        rows = []
        for tenant in sorted(self.tenants.values(), key=lambda t: t.name):
            keys = [k.row() for k in self.tenant_keys.values() if k.tenant == tenant.name]
            rows.append({**tenant.to_dict(), "keys": sorted(keys, key=lambda k: k["created"])})
        return rows

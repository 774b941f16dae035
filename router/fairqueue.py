"""One model's requests waiting for a slot, when its replicas are all at --max-in-flight: a
queue per tenant, released by priority band first, then by weight.

Within a band, start-time fair queueing: each tenant's next request carries a tag, the later of
the queue's virtual time and the tenant's last finish, plus 1 / weight; the lowest tag goes
first, and the virtual time moves to its start. Two tenants always waiting, of weights 1 and 3,
are released 1:3; a tenant that was away comes back at the present, with no credit saved up.
"""

from __future__ import annotations

from collections import deque


class FairQueue:
    def __init__(self, bound: int) -> None:
        self.bound = bound  # per tenant
        self.queues: dict[str, deque] = {}
        self.rules: dict[str, tuple[int, float]] = {}  # tenant -> (priority, weight)
        self.finish: dict[str, float] = {}  # tenant -> virtual finish of its last release
        self.virtual = 0.0
        self.size = 0

    def push(self, exchange, tenant: str, priority: int, weight: float) -> bool:
        """Queue `exchange`; False when its tenant's queue is full."""
        queue = self.queues.get(tenant)
        if queue is None:
            queue = self.queues[tenant] = deque()
        if len(queue) >= self.bound:
            return False
        queue.append(exchange)
        self.rules[tenant] = (priority, weight)
        self.size += 1
        return True

    def pop(self):
        """The next exchange to release, or None."""
        best = None
        for tenant, queue in self.queues.items():
            if not queue:
                continue
            priority, weight = self.rules[tenant]
            start = max(self.virtual, self.finish.get(tenant, 0.0))
            tag = (-priority, start + 1.0 / weight, tenant)
            if best is None or tag < best[0]:
                best = (tag, tenant, start)
        if best is None:
            return None
        (_, finish, _), tenant, start = best
        self.virtual = start
        self.finish[tenant] = finish
        queue = self.queues[tenant]
        exchange = queue.popleft()
        if not queue:
            del self.queues[tenant]
        self.size -= 1
        return exchange

    def remove(self, exchange, tenant: str) -> bool:
        queue = self.queues.get(tenant)
        if queue is None:
            return False
        try:
            queue.remove(exchange)
        except ValueError:
            return False
        if not queue:
            del self.queues[tenant]
        self.size -= 1
        return True

    def depth(self) -> dict[str, int]:
        return {tenant: len(queue) for tenant, queue in self.queues.items()}

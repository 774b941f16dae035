"""One model's requests waiting for a slot, when its replicas are all at --max-in-flight: a
queue per tenant, released by priority band first, then by weight.

Within a band, fair queueing by virtual time: a tenant's first waiting request starts at the
later of the queue's virtual time and the tenant's last finish, and finishes 1 / weight
later; the earliest finish goes first, the virtual time moves to its start, and the tenant's
next request starts where that one finished. Two tenants always waiting, of weights 1 and 3,
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
        self.start: dict[str, float] = {}  # tenant -> virtual start of its next release
        self.virtual = 0.0
        self.size = 0

    def push(self, exchange, tenant: str, priority: int, weight: float) -> bool:
        """Queue `exchange`; False when its tenant's queue is full."""
        queue = self.queues.get(tenant)
        if queue is None:
            queue = self.queues[tenant] = deque()
            self.start[tenant] = max(self.virtual, self.finish.get(tenant, 0.0))
        if len(queue) >= self.bound:
            return False
        queue.append(exchange)
        self.rules[tenant] = (priority, weight)
        self.size += 1
        return True

    def pop(self):
        """The next exchange to release, or None."""
        best = None
        for tenant in self.queues:
            priority, weight = self.rules[tenant]
            tag = (-priority, self.start[tenant] + 1.0 / weight, tenant)
            if best is None or tag < best:
                best = tag
        if best is None:
            return None
        _, finish, tenant = best
        self.virtual = self.start[tenant]
        self.finish[tenant] = self.start[tenant] = finish
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

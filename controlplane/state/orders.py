"""Orders reach agents at once: which nodes' assignments may have changed, and the agents'
watches parked until they do.

An agent heartbeats (its liveness and its replicas' states, answered with its assignments)
and also watches its assignments with a long poll, `GET /v1/nodes/NAME/assignments?digest=D`,
so that a start, stop, sleep, wake or adapter load decided by a tick reaches it as soon as
the tick is over, not at its next heartbeat.

Every answer, a heartbeat's or a watch's, carries the version of the orders it holds:
`MARK.COUNTER`, where MARK names this leader's term and COUNTER grows with every change. A
heartbeat's answer and a watch's may cross on the way: the agent applies an answer only when
its version is not older than the one it holds (a new MARK, a new term, always counts as
newer; a stale answer from the old term is put right by the next heartbeat).

A watch answers when its node's assignments differ from what the agent holds (D, the digest
of its last answer), or at its wait's end. It looks again whenever a replica on its node is
stored or removed (every change of what a node runs is one); a change that leaves the node's
assignments as they were (a replica's state as its own agent reported it) keeps it parked.
"""

from __future__ import annotations

import asyncio
import os
from hashlib import blake2b

import orjson

MAX_WAIT_S = 300.0


def digest(assignments: list[dict]) -> str:
    return blake2b(orjson.dumps(assignments), digest_size=8).hexdigest()


class Orders:
    def __init__(self) -> None:
        self.mark = os.urandom(4).hex()
        self.counter = 0
        self.waiters: dict[str, list[asyncio.Future]] = {}

    @property
    def version(self) -> str:
        return f"{self.mark}.{self.counter}"

    def touched(self, nodes) -> None:
        """What runs on `nodes` may have changed: their parked watches look again."""
        self.counter += 1
        for node in nodes:
            for waiter in self.waiters.pop(node, ()):
                if not waiter.done():
                    waiter.set_result(None)

    async def changed(self, node: str, timeout: float) -> bool:
        """Wait for the next change of `node`'s orders; False when `timeout` ended first."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(node, []).append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            parked = self.waiters.get(node)
            if parked is not None and waiter in parked:
                parked.remove(waiter)
                if not parked:
                    del self.waiters[node]

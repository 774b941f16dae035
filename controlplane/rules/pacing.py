"""Heartbeats paced by the control plane from the fleet's size, as Nomad's
`max_heartbeats_per_second` paces its clients: the defaults hold from 4 nodes to 16,000.

| fleet                          | period handed to each agent      | node timeout             |
|--------------------------------|----------------------------------|--------------------------|
| up to `max_per_s` x `period_s` | `period_s` (2 s)                 | `timeout_s` (15 s)       |
| nodes (N) larger than that     | N / `max_per_s` (32 s at 16,000) | `MISSED` periods (128 s) |

Every heartbeat's answer carries the period the agent is to keep (agents jitter it by ±10%,
so the fleet's rate stays near `max_per_s`); the server remembers per node the period it last
handed out, so a node told a long period while the fleet was large is not timed out on a short
one after the fleet shrank. A node still on an older, shorter period beats more often than
asked until its next answer: safe, and it only lasts one beat.
"""

from __future__ import annotations

from dataclasses import dataclass

MISSED = 4  # periods without a heartbeat before a large fleet's node is NotReady


@dataclass(frozen=True)
class HeartbeatPacing:
    period_s: float = 2.0  # a small fleet's heartbeat period
    max_per_s: float = 500.0  # heartbeats a second the control plane takes, fleet-wide
    timeout_s: float = 15.0  # a small fleet's node timeout

    def period(self, nodes: int) -> float:
        return max(self.period_s, nodes / self.max_per_s)

    def timeout(self, nodes: int, told_s: float = 0.0) -> float:
        """How long a node may stay silent: it was told `told_s` (0: nothing yet)."""
        return max(self.timeout_s, MISSED * max(told_s, self.period(nodes)))

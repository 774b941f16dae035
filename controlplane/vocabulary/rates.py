"""How popular each replica is: the requests routers send it, a second, over a recent window.

Each router reports, per replica, the requests it has sent there since its table took the
replica (a counter: `requests` in its activity report). The rate is what those counters grew
by, summed over routers, decayed exponentially with a time constant of `window_s`: a burst
counts for about a window, an old one fades, and the cost is one number per replica.

| what a report says of a replica                   | what is counted                        |
|---------------------------------------------------|----------------------------------------|
| first report of this router incarnation           | nothing: its counter's past is unknown |
|                                                   | (a restart must not look like a burst) |
| the counter grew by n since its last report       | n requests, now                        |
| the counter went back (the slot was made anew)    | its new value                          |
| a replica no report names any more                | nothing; its rate fades                |

Requests for an adapter count for the replica that holds it: the report's `REPLICA@ADAPTER`
counters are folded into REPLICA before they come here (idle.py's fold_adapter_slots).
"""

from __future__ import annotations

import math

WINDOW_S = 60.0  # a minute: long enough to ride out a burst's gaps, short enough to follow a day


class RequestRates:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        # router -> (its incarnation, its last counters: replica -> requests sent since watched)
        self.counters: dict[str, tuple[str, dict[str, int]]] = {}
        self.level: dict[str, tuple[float, float]] = {}  # replica -> (decayed count, at)

    def take(self, router: str, incarnation: str, requests: dict[str, int], now: float) -> None:
        """One report's counters (replica -> requests sent since watched)."""
        folded = dict(requests)
        last = self.counters.get(router)
        self.counters[router] = (incarnation, folded)
        if last is None or last[0] != incarnation:
            return  # a router new to us, or restarted: its counters' past is unknown
        before = last[1]
        for replica, count in folded.items():
            grew = count - before.get(replica, 0)
            self._add(replica, count if grew < 0 else grew, now)

    def _add(self, replica: str, requests: int, now: float) -> None:
        if requests <= 0:
            return
        level, at = self.level.get(replica, (0.0, now))
        self.level[replica] = (level * math.exp(-max(0.0, now - at) / self.window_s) + requests,
                               now)  # fmt: skip

    def rate(self, replica: str, now: float) -> float:
        """Requests a second sent to `replica`, over the recent window."""
        level, at = self.level.get(replica, (0.0, now))
        return level * math.exp(-max(0.0, now - at) / self.window_s) / self.window_s

    def rates(self, now: float) -> dict[str, float]:
        """replica -> its rate; what has faded to nothing is forgotten on the way."""
        out = {}
        for replica in list(self.level):
            rate = self.rate(replica, now)
            if rate * self.window_s < 1e-3:
                del self.level[replica]
            else:
                out[replica] = rate
        return out

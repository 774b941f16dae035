"""When a router reports at once, between its periodic activity reports.

A replica on its way out (stopped, put to sleep, an adapter unloaded) waits for every live
router to report a route version without it and nothing in flight on it. Reports go every
`--tick` (2 s), so waiting for the next one would add up to two ticks to every swap. Instead
the router reports as soon as it holds a new route version, and again as soon as the last
request on a replica that left its table ends.
"""

from __future__ import annotations


class PromptAcks:
    def __init__(self, table) -> None:
        self.table = table
        self.routed: set[int] = set()  # the table's slots at the last route version
        self.draining: set[int] = set()  # slots that left the table with requests on them
        self.new_version = False

    def routes_changed(self) -> None:
        """A new route version was applied: acknowledge it, and follow what left with
        requests still on it."""
        table = self.table
        routed = {slot for model in table.models() for slot, _, _ in table.endpoints(model)}
        for slot in self.routed - routed:
            if table.in_flight(slot) > 0:
                self.draining.add(slot)
        self.draining -= routed  # back in the table: nothing to tell
        self.routed = routed
        self.new_version = True

    @property
    def watching(self) -> bool:
        """Whether a request on a replica that left the table may end any moment."""
        return bool(self.draining)

    def due(self) -> bool:
        """Whether a report should go now (and, once asked, is no longer due)."""
        drained = {slot for slot in self.draining if self.table.in_flight(slot) == 0}
        self.draining -= drained
        due = self.new_version or bool(drained)
        self.new_version = False
        return due

"""Random interleavings of uses, reports, goodbyes, crashes, cuts and restarts of two routers:
the idle answer is never more than the truth allows.

A router reports once a tick, so what the control plane knows is as of the oldest last report
among the routers it holds live: a use after that moment cannot be known yet. The invariant,
at that reference moment: a bound (exact or at_least) never exceeds the true time since the
replica's last use before it, by any router, reported or not, cut off or dead. A router that
is cut off or dead stays live for at most the lease; after that its replicas must be unknown.
One thing no control plane can know is a router incarnation it has never heard from: its uses
count here once that incarnation has reported (before or after them).
"""

from hypothesis import example, given, settings
from hypothesis import strategies as st

from controlplane.vocabulary.idle import IdleState, IdleTracker
from tests.controlplane.conftest import Clock

LEASE = 10.0
ROUTERS = ("r1", "r2")
REPLICAS = ("a", "b", "c")


class SimRouter:
    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.incarnation = 0
        self.alive = True
        self.cut = False
        self.started = now
        self.uses: dict[str, float] = {}
        self.last_report = now
        self.has_table = True
        self.table_since = now

    def body(self, now: float, goodbye: bool = False) -> dict:
        body = {
            "router": self.name,
            "incarnation": f"i{self.incarnation}",
            "uptime_s": now - self.started,
            "used": {r: now - t for r, t in self.uses.items()},
            "watched": {r: now - self.table_since for r in REPLICAS} if self.has_table else {},
        }
        if goodbye:
            body["goodbye"] = True
        return body


steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["advance", "use", "report", "goodbye", "crash", "restart", "routes", "cut", "heal"]
        ),
        st.sampled_from(ROUTERS),
        st.sampled_from(REPLICAS),
        st.floats(0.1, 30),
    ),
    max_size=80,
)


@settings(max_examples=2000, deadline=None)
@given(steps)
# Found by this test: a router restarted after its goodbye, reporting before its routes came.
# Any live router, not only one already routing to a replica, may use it before its next report.
@example(
    [
        ("use", "r1", "a", 1.0),
        ("goodbye", "r1", "a", 1.0),
        ("restart", "r1", "a", 1.0),
        ("report", "r1", "a", 1.0),
        ("report", "r2", "a", 1.0),
    ]
)
# And: one that restarted after its goodbye, reported before its routes came, got them, used a
# replica and fell silent: its last report watched nothing, yet it may have been routing.
@example(
    [
        ("goodbye", "r1", "a", 1.0),
        ("restart", "r1", "a", 1.0),
        ("report", "r1", "a", 1.0),
        ("routes", "r1", "a", 1.0),
        ("advance", "r1", "a", 10.0),
        ("use", "r1", "a", 1.0),
        ("report", "r2", "a", 1.0),
    ]
)
def test_no_bound_exceeds_the_truth(ops):
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=LEASE)
    routers = {name: SimRouter(name, clock()) for name in ROUTERS}
    uses: dict[str, list[tuple[float, str, int]]] = {r: [] for r in REPLICAS}
    heard: set[tuple[str, int]] = set()  # incarnations that have reported
    reported_at: dict[str, float] = {}  # the newest report of each router not gone
    for op, name, replica, seconds in ops:
        clock.advance(0.001)  # every step takes time: order shows in the clock
        router = routers[name]
        now = clock()
        if op == "advance":
            clock.advance(seconds)
        elif op == "use" and router.alive and router.has_table:
            router.uses[replica] = now
            uses[replica].append((now, name, router.incarnation))
        elif op in ("report", "goodbye") and router.alive and not router.cut:
            idle.report(router.body(now, goodbye=op == "goodbye"))
            reported_at[name] = now
            heard.add((name, router.incarnation))
            if op == "goodbye":
                del reported_at[name]  # gone: it uses nothing from here on
            router.alive = op == "report"
        elif op == "crash":
            router.alive = False
        elif op == "restart" and not router.alive:
            router.incarnation += 1
            router.alive, router.cut, router.started, router.uses = True, False, now, {}
            router.has_table = False  # its first reports may come before its routes
        elif op == "routes" and router.alive and not router.has_table:
            router.has_table, router.table_since = True, now
        elif op == "cut":
            router.cut = True
        elif op == "heal":
            router.cut = False
        now = clock()
        recent = [at for at in reported_at.values() if now - at <= LEASE]
        for replica in REPLICAS:
            seconds_idle, state = idle.idle_for(replica)
            if state is IdleState.UNKNOWN:
                assert seconds_idle < 0
                continue
            reference = min(recent)
            before = [at for at, *who in uses[replica] if at <= reference and tuple(who) in heard]
            if before:
                assert seconds_idle <= reference - max(before) + 1e-6, (replica, state)

"""Random interleavings of uses, reports, goodbyes, crashes, cuts and restarts of two routers:
the idle answer is never more than the truth allows.

A router reports once a tick, so the control plane can only know of a use once the router
that made it has reported after it, or once a newer incarnation of that router has reported
(the old one's death then leaves a gap the bound may not cross). Until then the router is live
for at most the lease, and silent after it, which makes its replicas unknown. The invariant: a
bound (exact or at_least) never exceeds the time since the newest use the control plane could
have known of.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.idle import IdleState, IdleTracker
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

    def body(self, now: float, goodbye: bool = False) -> dict:
        body = {
            "router": self.name,
            "incarnation": f"i{self.incarnation}",
            "uptime_s": now - self.started,
            "used": {r: now - t for r, t in self.uses.items()},
            "watched": {r: now - self.started for r in REPLICAS},
        }
        if goodbye:
            body["goodbye"] = True
        return body


steps = st.lists(
    st.tuples(
        st.sampled_from(["advance", "use", "report", "goodbye", "crash", "restart", "cut", "heal"]),
        st.sampled_from(ROUTERS),
        st.sampled_from(REPLICAS),
        st.floats(0.1, 30),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(steps)
def test_no_bound_exceeds_the_truth(ops):
    clock = Clock()
    idle = IdleTracker(clock=clock, live_window_s=LEASE)
    routers = {name: SimRouter(name, clock()) for name in ROUTERS}
    uses: list[tuple[str, str, int, float, int]] = []  # replica, router, incarnation, time, step
    reported_at: dict[tuple[str, int], int] = {}  # the step of each incarnation's last report
    newest_incarnation_heard: dict[str, int] = {}
    for step, (op, name, replica, seconds) in enumerate(ops):
        router = routers[name]
        now = clock()
        if op == "advance":
            clock.advance(seconds)
        elif op == "use" and router.alive:
            router.uses[replica] = now
            uses.append((replica, name, router.incarnation, now, step))
        elif op in ("report", "goodbye") and router.alive and not router.cut:
            idle.report(router.body(now, goodbye=op == "goodbye"))
            reported_at[(name, router.incarnation)] = step
            newest_incarnation_heard[name] = router.incarnation
            router.alive = op == "report"
        elif op == "crash":
            router.alive = False
        elif op == "restart" and not router.alive:
            router.incarnation += 1
            router.alive, router.cut, router.started, router.uses = True, False, now, {}
        elif op == "cut":
            router.cut = True
        elif op == "heal":
            router.cut = False
        knowable = {}
        for used, by, incarnation, at, when in uses:
            if reported_at.get((by, incarnation), -1) > when or (
                newest_incarnation_heard.get(by, -1) > incarnation
            ):
                knowable[used] = max(knowable.get(used, at), at)
        check(idle, clock(), knowable)


def check(idle: IdleTracker, now: float, knowable_last: dict[str, float]) -> None:
    for replica in REPLICAS:
        seconds, state = idle.idle_for(replica)
        if state is IdleState.UNKNOWN:
            assert seconds < 0
            continue
        if replica in knowable_last:
            assert seconds <= now - knowable_last[replica] + 1e-6, (replica, state)

"""The reconciler: one tick moves the fleet towards what the specs ask for.

It marks silent nodes NotReady and fails their replicas, drops failed replicas after a while,
places missing replicas, stops extra ones (and those of deleted models or draining nodes once
their replacement is ready), and publishes the routing table. Time comes from the fleet's
injected clocks, so a test drives it tick by tick without sleeping.
"""

from __future__ import annotations

import asyncio
import time

from controlplane.adapters import AdapterInputs, plan_adapters, slot_id
from controlplane.autoscale import decide
from controlplane.fleet import Fleet
from controlplane.idle import IdleState
from controlplane.model import ReplicaState, Schedulable, Slice, gpu_faults
from controlplane.model import format_duration as duration
from controlplane.placement import Placer, eligible
from controlplane.records import Reservation
from controlplane.room import RoomInputs, plan_room
from controlplane.scaling import plan_idle_stops
from controlplane.sleep import (
    memory_stops,
    plan_idle,
    plan_wake,
    settled,
    victim_moves,
)

LIVE = {ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.UNHEALTHY}
# A model's replicas that count towards what it keeps: awake, or asleep and woken instead of
# placing another.
PRESENT = LIVE | {ReplicaState.SLEEPING, ReplicaState.ASLEEP, ReplicaState.WAKING}


class RouteTable:
    """The EndpointSink's source: {model: [{id, url}]} of Ready replicas, with a version.

    Versions start from the wall clock in milliseconds, so that they keep increasing across a
    control-plane restart and a router never mistakes a new table for one it already has.
    """

    def __init__(self) -> None:
        self.version = int(time.time() * 1000)
        self.routes: dict[str, list[dict]] = {}
        self.affinity: dict[str, str] = {}  # model -> its spec's affinity, where it sets one
        self._changed = asyncio.Event()

    def publish(self, routes: dict[str, list[dict]], affinity: dict | None = None) -> bool:
        affinity = affinity or {}
        if routes == self.routes and affinity == self.affinity:
            return False
        self.routes = routes
        self.affinity = affinity
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    def release_watchers(self) -> None:
        """Answer every waiting watch now, with the table as it is: a server that is stopping
        would otherwise wait out its drain deadline on routers' long polls."""
        self._changed.set()
        self._changed = asyncio.Event()

    def as_json(self) -> dict:
        return {"version": self.version, "routes": self.routes, "affinity": self.affinity}

    async def wait_for_change(self, after: int, timeout: float) -> dict:
        if after == self.version:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                pass
        return self.as_json()


class Reconciler:
    def __init__(
        self,
        fleet: Fleet,
        routes: RouteTable | None = None,
        node_timeout_s: float = 15.0,
        failed_retention_s: float = 600.0,
        min_residency_s: float = 120.0,
        autoscale_every_s: float = 1.0,
        room_timeout_s: float = 600.0,
    ) -> None:
        self.fleet = fleet
        self.routes = routes or RouteTable()
        self.node_timeout_s = node_timeout_s
        self.failed_retention_s = failed_retention_s
        self.min_residency_s = min_residency_s  # for specs that do not set min_residency
        # GPUs kept for a waiting model are given up when its victims have not stopped by
        # then (a silent router holds one): as a router's parked request gives up.
        self.room_timeout_s = room_timeout_s
        # Autoscaling decides once a period, not at every tick a heartbeat wakes: "at most
        # doubling a tick" must not double again on the same reports.
        self.autoscale_every_s = autoscale_every_s
        self.autoscaled_at = float("-inf")
        self.stops: dict[str, int] = {}  # replicas stopped for being idle, by who decided

    def tick(self) -> None:
        fleet = self.fleet
        with fleet.store.batch():
            self._check_heartbeats()
            self._expire_failed()
            self._check_sleepers()
            wanted = fleet.wanted()
            asking = {model: f"{n} request(s) waiting" for model, n in wanted.items()}
            asking.update(self._autoscale_all(wanted))
            self._place_on_reserved(asking)
            self._wake_asked(asking)
            self._sleep_idle()
            placer = self._placer()
            draining = {
                n.name for n in fleet.nodes.values() if n.schedulable == Schedulable.DRAINING
            }
            for spec in list(fleet.specs.values()):
                self._scale_down_idle(spec)
                self._reconcile_model(spec, placer, wanted, draining)
            self._make_room(asking)
            self._stop_orphans()
            self._stop_retired()
            self._sleep_withdrawn()
            self._place_adapters()
            self._unload_withdrawn()
            fleet.flush_activity()
            fleet.flush_records()
        self.routes.publish(self._routing_table(), self._affinity())
        self._stamp_withdrawals()
        # What this tick changed it has acted on; only news from outside wakes it again.
        fleet.changed = False

    def _affinity(self) -> dict[str, str]:
        """Each model's affinity, where its spec sets one; an adapter's is its base's."""
        fleet = self.fleet
        out = {s.name: s.affinity for s in fleet.specs.values() if s.affinity is not None}
        for adapter in fleet.adapters.values():
            if adapter.base in out:
                out[adapter.name] = out[adapter.base]
        return out

    def _acked_from(self, stamp: int) -> int:
        """The route version a router must hold for a withdrawal stamped `stamp`: 0, not yet
        published, is the next table's. Never above the table now published, which is without
        the route too: a stamp made by a leader whose clock ran ahead must not wait for ever."""
        return min(stamp, self.routes.version) if stamp else self.routes.version + 1

    def _stamp_withdrawals(self) -> None:
        """Routes withdrawn in this tick are gone from the table just published: its version
        is what every live router must have acknowledged before a stop, a sleep or an unload."""
        fleet = self.fleet
        version = self.routes.version
        with fleet.store.batch():
            for replica in fleet.replicas.values():
                withdrawing = replica.state == ReplicaState.RETIRING or (
                    replica.state == ReplicaState.SLEEPING and not replica.sleep
                )
                stamp = withdrawing and not replica.withdrawn_version
                fresh = [a for a, v in replica.unloading.items() if not v]
                if not (stamp or fresh):
                    continue
                if stamp:
                    replica.withdrawn_version = version
                if fresh:
                    replica.unloading = {**replica.unloading, **dict.fromkeys(fresh, version)}
                fleet.store.put_replica(replica)

    def _placer(self, also_held=frozenset()) -> Placer:
        """Placement over the fleet as it stands: cards held awake or kept for a waiting
        model are taken; cards with sleepers have their reserves taken off."""
        fleet = self.fleet
        return Placer(
            list(fleet.nodes.values()),
            fleet.held_gpus() | fleet.reserved_gpus().keys() | also_held,
            fleet.sleepers().reserve,
        )

    def _check_heartbeats(self) -> None:
        fleet = self.fleet
        now = fleet.clock()
        for node in fleet.nodes.values():
            silent = now - node.last_heartbeat
            if node.ready and silent > self.node_timeout_s:
                node.ready = False
                fleet.store.put_node(node)
                fleet.changed = True
            if node.ready:
                continue
            # Its own replicas only: a rack gone NotReady must not cost (nodes x replicas).
            for replica_id in list(fleet.on_node.get(node.name, ())):
                replica = fleet.replicas.get(replica_id)
                if replica is None:
                    continue
                if replica.state in (ReplicaState.STOPPING, ReplicaState.RETIRING):
                    fleet.remove_replica(replica.id)
                elif replica.state in PRESENT:
                    fleet.set_replica_state(
                        replica,
                        ReplicaState.FAILED,
                        f"node {node.name} is NotReady (no heartbeat for {silent:.0f}s)",
                    )

    def _expire_failed(self) -> None:
        fleet = self.fleet
        now = fleet.wall()
        for replica in list(fleet.replicas.values()):
            if (
                replica.state == ReplicaState.FAILED
                and now - replica.updated_at > self.failed_retention_s
            ):
                fleet.remove_replica(replica.id)

    def _reconcile_model(
        self, spec, placer: Placer, wanted: dict[str, int], draining: set[str]
    ) -> None:
        fleet = self.fleet
        mine = [r for r in fleet.replicas_of(spec.name) if r.state in PRESENT]
        # A replica on a failed GPU (Degraded) is replaced like one on a draining node, but is
        # stopped only once its replacement is Ready: it may still be serving meanwhile.
        degraded = {r.id for r in mine if gpu_faults(r, fleet.nodes)}
        staying = [r for r in mine if not draining.intersection(r.nodes) and r.id not in degraded]
        leaving = [r for r in mine if draining.intersection(r.nodes)]
        replaced = [r for r in mine if r.id in degraded and not draining.intersection(r.nodes)]
        desired = fleet.desired(spec)
        missing = desired - len(staying)
        if missing > 0:
            # Wanted again before it stopped: a retiring replica serves at once, no cold start.
            for replica in self._revivable(spec.name, draining)[:missing]:
                fleet.set_replica_state(
                    replica, ReplicaState.READY, "wanted again before it stopped"
                )
                staying.append(replica)
                missing -= 1
        if missing > 0 and spec.name in fleet.reservations:
            pass  # room is being made for it: it goes where its GPUs are kept
        elif missing > 0:
            outcome = placer.place(spec, missing)
            for placement in outcome.placements:
                fleet.add_replica(spec.name, placement)
            if (
                outcome.reason
                and spec.floor == 0
                and not wanted.get(spec.name)
                and Placer(list(fleet.nodes.values()), set()).place(spec, 1).placements
            ):
                # It would fit on the fleet's cards, others hold them, and nobody waits for
                # it: at zero until a request comes (and makes room), not an error.
                fleet.set_scaled(spec.name, len(staying) + len(outcome.placements))
                fleet.event(spec.name, f"at zero until a request comes: {outcome.reason}")
                fleet.set_reason(spec.name, "")
            elif spec.name not in fleet.room:
                fleet.set_reason(spec.name, outcome.reason)
        elif not fleet.room.get(spec.name, {}).get("wake"):
            fleet.set_reason(spec.name, "")
            fleet.room.pop(spec.name, None)
        extra = len(staying) - desired
        if extra > 0:
            # Stop the least useful first: not ready, then the longest idle, then the newest.
            idle = fleet.idle.idle_map([r.id for r in staying])

            def usefulness(replica):
                return (
                    replica.state == ReplicaState.READY,
                    -idle[replica.id][0],
                    -replica.created_at,
                )

            for replica in sorted(staying, key=usefulness)[:extra]:
                self._stop(replica, f"scaled down to {desired}")
        # Replicas on draining nodes go once their replacements are ready, or at once when no
        # replacement fits (the drain goes on; the model's reason tells the operator why).
        ready_staying = sum(1 for r in staying if r.state == ReplicaState.READY)
        if leaving and (ready_staying >= desired or spec.name in fleet.reasons):
            for replica in leaving:
                self._stop(replica, "node draining")
        if replaced and ready_staying >= desired:
            for replica in replaced:
                self._stop(replica, "replaced: " + "; ".join(gpu_faults(replica, fleet.nodes)))

    def _stop(self, replica, why: str) -> None:
        """A Ready replica goes through the safe stop (route withdrawn, acked, drained), and so
        does one whose routers are still dropping it on its way to sleep; one that never had
        a route (Pending, Starting) or sleeps stops at once: nobody can be using it."""
        withdrawing = replica.state == ReplicaState.SLEEPING and not replica.sleep
        if replica.state == ReplicaState.READY or withdrawing:
            self.fleet.withdraw(replica, f"{why}; route withdrawn")
        else:
            self.fleet.set_replica_state(replica, ReplicaState.STOPPING, why)

    def _revivable(self, model: str, draining: set[str]) -> list:
        """Retiring replicas of `model` that may serve again: none that a reservation counts
        on to free its GPUs, none on a draining node or a failed GPU."""
        fleet = self.fleet
        kept_for_others = {v for r in fleet.reservations.values() for v in r.victims}
        return [
            r
            for r in fleet.replicas_of(model)
            if (
                r.state == ReplicaState.RETIRING
                or (r.state == ReplicaState.SLEEPING and not r.sleep)  # its engine still awake
            )
            and r.url
            and r.id not in kept_for_others
            and not draining.intersection(r.nodes)
            and not gpu_faults(r, fleet.nodes)
        ]

    def _place_on_reserved(self, asking: dict[str, str]) -> None:
        """A model whose kept GPUs are free now (its victims stopped) is placed on them. GPUs
        are kept no longer when nobody asks for the model any more, when room came free
        elsewhere first, or past `room_timeout_s`."""
        fleet = self.fleet
        held = fleet.held_gpus()
        now = fleet.wall()
        for model, kept in list(fleet.reservations.items()):
            spec = fleet.specs.get(model)
            usable = spec is not None and all(
                (node := fleet.nodes.get(piece.node)) is not None and eligible(node)
                for piece in kept.placement
            )
            if not usable:
                del fleet.reservations[model]  # its model went, or a node: plan again
                continue
            if kept.gpus() & held:
                given_up = self._give_up_room(spec, kept, asking, held, now)
                if given_up:
                    del fleet.reservations[model]
                    fleet.room.pop(model, None)
                    fleet.event(
                        model, f"GPUs on {', '.join(kept.nodes())} no longer kept: {given_up}"
                    )
                continue  # a victim is still stopping
            stops = memory_stops(
                spec, sorted(kept.gpus()), self._room_inputs(now), fleet.sleepers(), {kept.wake}
            )
            if stops:
                # Sleepers beside the freed cards leave too little memory for it awake.
                self._carry_out(stops)
                if any(m.action == "blocked" for m in stops):
                    del fleet.reservations[model]  # plan again, elsewhere
                continue
            del fleet.reservations[model]
            if kept.wake:
                self._wake_on_reserved(spec, kept)
                continue
            placed = sum(1 for r in fleet.replicas_of(model) if r.state in PRESENT)
            if placed >= fleet.desired(spec):
                continue  # it found room elsewhere meanwhile
            replica = fleet.add_replica(model, kept.placement)
            fleet.swapping[replica.id] = (model, kept.since)
            fleet.woken_at[model] = fleet.wall()  # not stopped for idleness before its time
            fleet.event(
                model,
                f"placed on {', '.join(replica.nodes)} after {', '.join(kept.victims)} made way",
            )
            fleet.room.pop(model, None)
            fleet.set_reason(model, "")

    def _wake_on_reserved(self, spec, kept) -> None:
        fleet = self.fleet
        sleeper = fleet.replicas.get(kept.wake)
        if sleeper is None or sleeper.state != ReplicaState.ASLEEP:
            return  # it went meanwhile: the next tick plans again
        fleet.swapping[sleeper.id] = (spec.name, kept.since)
        fleet.woken_at[spec.name] = fleet.wall()
        fleet.wake(sleeper, f"woken after {', '.join(kept.victims)} made way")
        fleet.room.pop(spec.name, None)
        fleet.set_reason(spec.name, "")

    def _give_up_room(self, spec, kept, asking: dict[str, str], held, now: float) -> str:
        """Why GPUs kept for `spec` while its victims stop should be kept no longer ("" to
        keep them)."""
        if spec.name not in asking:
            return "no request waits for it any more"
        if now - kept.made_at > self.room_timeout_s:
            return f"its victims did not stop within {duration(self.room_timeout_s)}"
        others = {gpu for other in self.fleet.reservations.values() if other is not kept
                  for gpu in other.gpus()}  # fmt: skip
        if kept.wake:
            return ""  # a wake is the cheapest move there is
        placer = Placer(
            list(self.fleet.nodes.values()), held | others, self.fleet.sleepers().reserve
        )
        if placer.place(spec, 1).placements:
            return "room came free elsewhere first"
        return ""

    def _autoscale_all(self, wanted: dict[str, int]) -> dict[str, str]:
        """Autoscaled models move towards their load (controlplane/autoscale.py), once a
        period. Returns the models scaling out on load, for making room, with why."""
        fleet = self.fleet
        now = fleet.wall()
        if now - self.autoscaled_at < self.autoscale_every_s:
            return {}
        self.autoscaled_at = now
        live_in_flight = fleet.idle.in_flight(now, live_only=True)
        any_in_flight = fleet.idle.in_flight(now)
        silent = fleet.idle.silent_holders(list(fleet.replicas), now)
        out = {}
        for spec in list(fleet.specs.values()):
            if not spec.autoscaled:
                fleet.autoscale.pop(spec.name, None)
                continue
            mine = fleet.replicas_of(spec.name)
            in_flight = sum(live_in_flight.get(r.id, 0) for r in mine)
            waiting = wanted.get(spec.name, 0)
            current = fleet.desired(spec)
            decision = decide(
                spec,
                current,
                sum(1 for r in mine if r.state == ReplicaState.READY),
                in_flight,
                waiting,
                fleet.windows.get(spec.name),
                now,
                next((silent[r.id] for r in mine if r.id in silent), ""),
            )
            fleet.set_window(spec.name, decision.window)
            reason = decision.reason
            if decision.replicas > current:
                fleet.set_scaled(spec.name, decision.replicas)
                fleet.event(
                    spec.name, f"scaled out from {current} to {decision.replicas}: {reason}"
                )
            elif decision.replicas < current:
                victim = self._idlest(mine, any_in_flight, now)
                if victim is None:
                    reason += "; every replica busy or of unknown use: none stopped yet"
                else:
                    fleet.retire(victim, f"scaled in: {reason}; route withdrawn")
                    fleet.event(
                        spec.name,
                        f"scaled in from {current} to {decision.replicas}: {reason}",
                    )
            fleet.autoscale[spec.name] = {
                "reason": reason,
                "recommended": decision.recommended,
                "load": in_flight + waiting,
            }
            awake = sum(1 for r in mine if r.state in LIVE)
            if in_flight and fleet.desired(spec) > awake:
                out[spec.name] = f"scaling out on load ({reason})"
        return out

    def _idlest(self, replicas, in_flight: dict[str, int], now: float):
        """The replica to scale in: Ready, nothing in flight on any router, of known use, the
        longest idle; None when there is none."""
        ready = [r for r in replicas if r.state == ReplicaState.READY and not in_flight.get(r.id)]
        idle = self.fleet.idle.idle_map([r.id for r in ready], now)
        known = [r for r in ready if idle[r.id][1] != IdleState.UNKNOWN]
        return max(known, key=lambda r: (idle[r.id][0], r.id), default=None)

    def _make_room(self, wanted: dict[str, str]) -> None:
        """Models with requests waiting that cannot be placed take the GPUs of replicas
        nobody uses (controlplane/room.py); higher priority first, then the longest waiting.
        `wanted`: model -> why it wants room ("3 request(s) waiting")."""
        fleet = self.fleet
        now = fleet.wall()
        for model in list(fleet.demand_since):
            if model not in wanted:
                del fleet.demand_since[model]  # nobody waits any more
        for model in list(fleet.room):
            if model not in wanted:
                del fleet.room[model]
        short = []
        for model in wanted:
            spec = fleet.specs[model]
            placed = sum(1 for r in fleet.replicas_of(model) if r.state in PRESENT)
            if placed < fleet.desired(spec) and model not in fleet.reservations:
                fleet.demand_since.setdefault(model, now)
                short.append(spec)
        short.sort(key=lambda s: (-s.priority, fleet.demand_since[s.name], s.name))
        for spec in short:
            outcome = self._placer().place(spec, 1)
            if outcome.placements:
                continue  # it fits now: the next tick places it
            self._take_room(spec, wanted[spec.name], now, outcome.reason)

    def _room_inputs(self, now: float) -> RoomInputs:
        """What the pure steps of making room, sleeping and waking read: one snapshot."""
        fleet = self.fleet
        ids = list(fleet.replicas)
        return RoomInputs(
            nodes=list(fleet.nodes.values()),
            replicas=list(fleet.replicas.values()),
            specs=dict(fleet.specs),
            desired={name: fleet.desired(s) for name, s in fleet.specs.items()},
            idle=fleet.idle.idle_map(ids, now),
            in_flight=fleet.idle.in_flight(now),
            silent_holders=fleet.idle.silent_holders(ids, now),
            reserved=fleet.reserved_gpus(),
            now=now,
            default_residency_s=self.min_residency_s,
        )

    def _take_room(self, spec, why: str, now: float, placement_reason: str) -> None:
        fleet = self.fleet
        inputs = self._room_inputs(now)
        plan = plan_room(spec, inputs)
        if plan.placement is None:
            if plan.final:
                why = f"no room can be made: {plan.reason}" if plan.blockers else ""
                reason = "; ".join(x for x in (placement_reason, why) if x)
            else:
                reason = f"waiting for room: {plan.reason}"
            blocking = [b.replica for b in plan.blockers]
            before = fleet.room.get(spec.name)
            fleet.room[spec.name] = {
                "reason": reason,
                "victims": [],
                "blocking": blocking,
                "final": plan.final,
            }
            same = before is not None and before.get("blocking") == blocking
            fleet.set_reason(spec.name, reason, quiet=same)
            return
        gpus = sorted((p.node, i) for p in plan.placement for i in p.gpus)
        if not plan.victims:
            # Free cards, but sleepers on them keep too much memory: they go (a plan whose
            # sleepers may not go leaves the model waiting, and says why).
            stops = memory_stops(spec, gpus, inputs, fleet.sleepers())
            blocked = [m.why for m in stops if m.action == "blocked"]
            if blocked:
                fleet.set_reason(spec.name, "waiting for room: " + "; ".join(blocked))
            else:
                self._carry_out(stops)
            return
        memory = fleet.sleepers()
        moves = victim_moves(plan.victims, f"to make room for {spec.name}: {why}", inputs, memory)
        moves = settled(moves + memory_stops(spec, gpus, inputs, memory))
        self._carry_out([m for m in moves if m.action != "blocked"])
        fleet.reservations[spec.name] = Reservation(
            spec.name,
            plan.placement,
            [v.id for v in plan.victims],
            fleet.demand_since[spec.name],
            now,
        )
        nodes = ", ".join(piece.node for piece in plan.placement)
        sleeping = [m.replica.id for m in moves if m.action == "sleep"]
        stopping = [v.id for v in plan.victims if v.id not in sleeping]
        how = "; ".join(
            f"{verb} {', '.join(ids)}"
            for verb, ids in (("stopping", stopping), ("putting to sleep", sleeping))
            if ids
        )
        reason = f"waiting for room: {how} on {nodes}"
        fleet.room[spec.name] = {
            "reason": reason,
            "victims": [v.id for v in plan.victims],
            "final": False,
        }
        fleet.set_reason(spec.name, reason)

    def _carry_out(self, moves) -> None:
        """Moves of a sleep plan: victims and idle replicas sleep or stop through the safe
        stop; sleepers (nothing routes to them) stop at once."""
        fleet = self.fleet
        for move in moves:
            replica = move.replica
            if replica is None:
                continue
            why = move.why
            if move.action == "sleep":
                seconds, state = fleet.idle.idle_for(replica.id)
                bound = "≥" if state == IdleState.AT_LEAST else ""
                if not why.startswith("idle"):
                    why += f"; idle {bound}{duration(seconds)}"
                fleet.put_to_sleep(replica, why, seconds)
                self.stops["sleep"] = self.stops.get("sleep", 0) + 1
            elif replica.state == ReplicaState.READY:
                seconds, state = fleet.idle.idle_for(replica.id)
                bound = "≥" if state == IdleState.AT_LEAST else ""
                fleet.retire(replica, f"{why}; idle {bound}{duration(seconds)}; route withdrawn")
                self.stops["room"] = self.stops.get("room", 0) + 1
            else:
                spec = fleet.specs.get(replica.model)
                if spec is not None:
                    fleet.set_scaled(replica.model, fleet.desired(spec) - 1)
                self._stop(replica, why)

    def _sleep_idle(self) -> None:
        """Replicas idle past `sleep.after` sleep; sleepers idle past `scale_to_zero_after`
        stop (controlplane/sleep.py)."""
        fleet = self.fleet
        if not any(s.sleep_level is not None for s in fleet.specs.values()):
            return
        plan = plan_idle(self._room_inputs(fleet.wall()), fleet.woken_at)
        for move in plan.moves:
            self._carry_out([move])
            if move.action == "stop":
                self.stops["idle"] = self.stops.get("idle", 0) + 1

    def _wake_asked(self, asking: dict[str, str]) -> None:
        """A model asked for (requests waiting, or load) with fewer engines awake than it
        keeps wakes a sleeper, putting the awake occupant of its cards to sleep first if it
        may (controlplane/sleep.py); else it waits, and its reason says for what."""
        fleet = self.fleet
        now = fleet.wall()
        for model in sorted(asking, key=lambda m: (-fleet.specs[m].priority, m)):
            spec = fleet.specs[model]
            if model in fleet.reservations:
                continue
            mine = fleet.replicas_of(model)
            awake = sum(1 for r in mine if r.state in LIVE or r.state == ReplicaState.WAKING)
            if awake >= fleet.desired(spec):
                continue
            kept_for_others = {v for r in fleet.reservations.values() for v in r.victims}
            dozing = [
                r
                for r in mine
                if r.state == ReplicaState.SLEEPING and not r.sleep and r.id not in kept_for_others
            ]
            if dozing:
                # Its engine is still awake, only its routes are going: it serves again.
                fleet.set_replica_state(
                    dozing[0], ReplicaState.READY, "wanted again before it slept"
                )
                continue
            asleep = [r for r in mine if r.state == ReplicaState.ASLEEP and r.sleep]
            if not asleep:
                continue
            fleet.demand_since.setdefault(model, now)
            plan = plan_wake(spec, self._room_inputs(now))
            if plan.replica is None:
                if plan.final and self._placer().place(spec, 1).placements:
                    # No sleeper can ever wake where it is (what holds its cards is there for
                    # good), free cards wait elsewhere: a cold start there; the sleeper goes.
                    self._stop(asleep[0], f"replaced by a cold start: {plan.reason}")
                    continue
                reason = f"waiting to wake: {plan.reason}"
                fleet.room[model] = {"reason": reason, "victims": [], "final": False, "wake": True}
                fleet.set_reason(model, reason, quiet=True)
                continue
            if plan.now:
                fleet.woken_at[model] = now
                fleet.wake(plan.replica, f"woken: {asking[model]}")
                fleet.room.pop(model, None)
                fleet.set_reason(model, "")
                continue
            self._carry_out(plan.moves)
            placement = plan.replica.placement
            fleet.reservations[model] = Reservation(
                model,
                [Slice(p.node, list(p.gpus)) for p in placement],
                [m.replica.id for m in plan.moves],
                fleet.demand_since[model],
                now,
                wake=plan.replica.id,
            )
            names = ", ".join(m.replica.id for m in plan.moves)
            reason = f"waiting for room: {names} making way to wake {plan.replica.id}"
            fleet.room[model] = {"reason": reason, "victims": [m.replica.id for m in plan.moves],
                                 "final": False, "wake": True}  # fmt: skip
            fleet.set_reason(model, reason)

    def _sleep_withdrawn(self) -> None:
        """A replica on its way to sleep is told to sleep once no router may route to it or
        has a request on it (the safe stop's wait, ending in sleep instead of a stop)."""
        fleet = self.fleet
        for replica in list(fleet.replicas.values()):
            if replica.state != ReplicaState.SLEEPING or replica.sleep:
                continue
            spec = fleet.specs.get(replica.model)
            held = fleet.idle.still_held(replica.id, self._acked_from(replica.withdrawn_version))
            reason = replica.reason.split("; waiting: ")[0]
            if held:
                if not replica.reason.endswith(held):
                    fleet.set_replica_state(
                        replica, ReplicaState.SLEEPING, f"{reason}; waiting: {held}"
                    )
                continue
            replica.sleep = spec.sleep_level if spec and spec.sleep_level else 1
            replica.slept_at = fleet.wall()
            reason = reason.removesuffix("; route withdrawn")
            fleet.set_replica_state(
                replica,
                ReplicaState.SLEEPING,
                f"{reason}: engine told to sleep (level {replica.sleep})",
            )

    def _place_adapters(self) -> None:
        """Adapters load where requests wait for them, and unload where they have gone unused
        longest when their base's replicas are full (controlplane/adapters.py)."""
        fleet = self.fleet
        if not fleet.adapters and not any(r.want_adapters for r in fleet.replicas.values()):
            return
        now = fleet.wall()
        slots = [slot_id(r.id, name) for r in fleet.replicas.values() for name in r.want_adapters]
        plan = plan_adapters(
            AdapterInputs(
                adapters=dict(fleet.adapters),
                specs=dict(fleet.specs),
                replicas=list(fleet.replicas.values()),
                waiting=fleet.wanted_adapters(),
                idle=fleet.idle.idle_map(slots, now),
                in_flight=fleet.idle.in_flight(now),
            )
        )
        for name, replica, why in plan.unloads:
            fleet.unload_adapter(replica, name, why)
        for name, replica in plan.loads:
            fleet.load_adapter(replica, name)
        for name in fleet.adapters:
            reason = plan.reasons.get(name, "")
            if reason != fleet.adapter_reasons.get(name, ""):
                if reason:
                    fleet.adapter_reasons[name] = reason
                    fleet.event(name, reason)
                else:
                    fleet.adapter_reasons.pop(name, None)

    def _unload_withdrawn(self) -> None:
        """An adapter withdrawn from a replica's routes is unloaded by its engine once no
        router may route to it there or has a request on it (the safe stop, per adapter)."""
        fleet = self.fleet
        for replica in fleet.replicas.values():
            if not replica.unloading:
                continue
            done = [
                a
                for a, version in replica.unloading.items()
                if not fleet.idle.still_held(slot_id(replica.id, a), self._acked_from(version))
            ]
            if done:
                replica.unloading = {a: v for a, v in replica.unloading.items() if a not in done}
                fleet.store.put_replica(replica)
                fleet.changed = True
                for name in done:
                    fleet.event(name, f"unloaded from {replica.id}: no router holds it there")

    def _check_sleepers(self) -> None:
        """An engine that did not wake within its model's wake timeout is restarted cold (it
        fails, and the model places another); one that did not fall asleep is stopped."""
        fleet = self.fleet
        now = fleet.wall()
        for replica in list(fleet.replicas.values()):
            spec = fleet.specs.get(replica.model)
            if spec is None:
                continue
            limit = spec.wake_timeout_s
            if replica.state == ReplicaState.WAKING and now - replica.woken_at > limit:
                fleet.set_replica_state(
                    replica,
                    ReplicaState.FAILED,
                    f"did not wake within {duration(limit)}: restarted cold",
                )
            elif (
                replica.state == ReplicaState.SLEEPING
                and replica.sleep
                and now - replica.slept_at > limit
            ):
                fleet.set_scaled(replica.model, fleet.desired(spec) - 1)
                fleet.set_replica_state(
                    replica, ReplicaState.STOPPING, f"did not fall asleep within {duration(limit)}"
                )

    def _scale_down_idle(self, spec) -> None:
        """Models with `scale_to_zero_after`: replicas idle that long go, down to min_replicas."""
        fleet = self.fleet
        if spec.scale_to_zero_after_s is None:
            return
        may_stop = fleet.desired(spec) - spec.floor
        woke = fleet.woken_at.get(spec.name)
        if may_stop <= 0 or (woke and fleet.wall() - woke < spec.scale_to_zero_after_s):
            return
        ready = [r for r in fleet.replicas_of(spec.name) if r.state == ReplicaState.READY]
        idle = fleet.idle.idle_map([r.id for r in ready])
        plan = plan_idle_stops(ready, idle, spec.scale_to_zero_after_s, may_stop, {})
        for replica in plan.stop:
            seconds, state = idle[replica.id]
            bound = "≥" if state == IdleState.AT_LEAST else ""
            fleet.retire(replica, f"idle {bound}{round(seconds)}s; route withdrawn")
            self.stops["idle"] = self.stops.get("idle", 0) + 1

    def _stop_retired(self) -> None:
        """A retiring replica stops once no router may route to it or has a request on it;
        until then its reason says which router holds it (a silent one blocks the stop)."""
        fleet = self.fleet
        for replica in list(fleet.replicas.values()):
            if replica.state != ReplicaState.RETIRING:
                continue
            held = fleet.idle.still_held(replica.id, self._acked_from(replica.withdrawn_version))
            if not held:
                reason = replica.reason.split("; waiting: ")[0].removesuffix("; route withdrawn")
                fleet.set_replica_state(
                    replica, ReplicaState.STOPPING, f"{reason}: no router holds it"
                )
            elif not replica.reason.endswith(held):
                reason = replica.reason.split("; waiting: ")[0]
                fleet.set_replica_state(
                    replica, ReplicaState.RETIRING, f"{reason}; waiting: {held}"
                )

    def _stop_orphans(self) -> None:
        fleet = self.fleet
        for replica in list(fleet.replicas.values()):
            if replica.model in fleet.specs:
                continue
            if replica.state in PRESENT:
                self._stop(replica, "model deleted")  # its streams end before it stops
            elif replica.state == ReplicaState.FAILED:
                fleet.remove_replica(replica.id)

    def _routing_table(self) -> dict[str, list[dict]]:
        fleet = self.fleet
        routes: dict[str, list[dict]] = {name: [] for name in sorted(fleet.specs)}
        for name in sorted(fleet.adapters):
            routes[name] = []
        for replica in sorted(fleet.replicas.values(), key=lambda r: r.id):
            if replica.state != ReplicaState.READY or not replica.url:
                continue
            if replica.model in routes:
                routes[replica.model].append({"id": replica.id, "url": replica.url})
            for name in replica.want_adapters:
                if name in replica.adapters and name in routes:
                    routes[name].append({"id": slot_id(replica.id, name), "url": replica.url})
        return routes

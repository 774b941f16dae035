"""Each tenant's limits split among the live routers that asked for it, and usage per tenant.

Routers report, per tenant, what they were asked for (requests and tokens, admitted or not:
a router held to a small share must still show what it could use) and what they served, as
counters since they started. The ledger turns the counters into rates and into minute buckets
of usage, and splits each limit:

    share(router) = floor + by_demand(limit - floors, demand(router) - floor)

by_demand: in proportion to demand when the routers together ask for more than the rest, else
each its demand and the spare spread evenly.
where floor = min(2% of the limit, limit / routers). Only the routers that have asked for
the tenant (their reports count a request of it) are in its split: a router that never did
holds nothing of it, so that a tenant's limit does not shrink with the routers of the fleet.
Shares add up to the limit. A router the table does not name for a tenant (its first request
came since the last table) admits against a fixed allowance, the floor of a router alone
(2% of the limit, at least one request and one in flight), until the next table names it, a
report period and a tick later; so does a router whose share's lease ran out (it lost the
control plane), at its floor. The fleet-wide rate exceeds the limit by at most the allowance
of the routers that began to ask within one table's round trip, and the floors of those cut
off, never by anything held by routers that do not ask.

`max_in_flight` is split in whole requests, max-min fair by the concurrency each router
wanted: a router reports the most of the tenant's requests it held or was asked to hold at
once since its last report (in flight plus the one asking). A router that wanted no more than
its share keeps what it wanted; the rest is dealt evenly among the routers that wanted more
(each asking router at least one). So its excess is at most the asking routers beyond the
limit (16 askers of a tenant with max_in_flight 4 hold one each), and a router whose clients
retry a refusal at once does not take the others' slots by asking more often. A share grows
only into slots known free (`grown_into_free_slots`): a router cut in the last table may
still hold what it admitted before it.

Shares move slowly on purpose: every new table makes each router report at once, so a rate
is taken over at least MIN_RATE_S, and a tenant's published shares hold SHARE_HOLD_S unless
the routers asking for it changed. Without both, 16 routers published 80 tables a second,
each a rate over a gap of milliseconds.
"""

from __future__ import annotations

import math
from collections import deque

import orjson

from controlplane.vocabulary.idle import ReportError

FLOOR_SHARE = 0.02
# Of each rate, kept aside for the routers not named (new to a tenant, or cut off): each takes
# its part, this over every router heard, so that together they stay within it.
RESERVED_SHARE = 0.005
SHARE_LEASE_S = 15.0  # a router keeps its share this long after last hearing the table
DEMAND_SMOOTHING = 0.5  # weight of the newest rate in the moving average
ROUTER_GONE_S = 30.0  # a router not heard from this long leaves the split
SHARE_CHANGE = 0.02  # of the limit: smaller moves are not worth a new table version
MIN_RATE_S = 2.0  # a demand rate is taken over at least this long
SHARE_HOLD_S = 2.0  # published shares hold this long while the same routers ask
USAGE_KEPT_S = 24 * 3600.0
# Usage counters per (tenant, model), in this order, in reports and in minute buckets.
USAGE_FIELDS = (
    "requests",
    "errors",
    "rate_limited",
    "prompt_tokens",
    "completion_tokens",
    "queue_wait_s",
)


def floor_of(limit: float, routers: int) -> float:
    return min(limit * FLOOR_SHARE, limit / max(routers, 1))


def split(limit: float, demands: dict[str, float]) -> dict[str, float]:
    """Each router's per-minute share of `limit` from its demand (per minute). The floor is
    each router's only as far as it asks: sixteen routers that once asked and now ask
    nothing held 2% each, a third of the limit that the routers asking could not use."""
    if not demands:
        return {}
    floor = floor_of(limit, len(demands))
    floors = {router: min(floor, demand) for router, demand in demands.items()}
    rest = max(0.0, limit - sum(floors.values()))
    wants = {router: max(0.0, demand - floors[router]) for router, demand in demands.items()}
    return {router: floors[router] + given for router, given in by_demand(rest, wants).items()}


def split_fair(limit: int, wanted: dict[str, float | None]) -> dict[str, int]:
    """`limit` whole requests in flight, max-min fair: a router that wants no more than an
    even part of what is left gets what it wants (at least one); the others (None: wants more
    than it was given) share the rest evenly, the remainder to the first by name."""
    if len(wanted) >= limit:
        # No more than the limit, at any number of routers: a slot each to the `limit` that
        # want the most (wanting more than they hold first, then by name); the others none,
        # their requests waiting for a share or answered 429 when none comes.
        order = sorted(wanted, key=lambda r: (wanted[r] is not None, -(wanted[r] or 0), r))
        return {router: 1 if i < limit else 0 for i, router in enumerate(order)}
    given: dict[str, int] = {}
    left, open_ = limit, sorted(wanted)
    while open_:
        part = left / len(open_)
        modest = [r for r in open_ if wanted[r] is not None and max(1, wanted[r]) <= part]
        if not modest:
            break
        for router in modest:
            given[router] = max(1, math.ceil(wanted[router]))
            left -= given[router]
        open_ = [r for r in open_ if r not in given]
    # What is left goes to the routers that want more; where none does, to all of them, so
    # that a router's next burst finds room.
    takers = open_ or sorted(wanted)
    even, extra = divmod(max(left, 0), len(takers))
    for index, router in enumerate(takers):
        given[router] = max(1, given.get(router, 0) + even + (1 if index < extra else 0))
    return given


def grown_into_free_slots(
    limit: int,
    fresh: dict,
    old: dict,
    reported: dict,
    unacked: dict | None = None,
    holding: dict | None = None,
) -> dict[str, int]:
    """`fresh` shares of max_in_flight, with each increase held to the slots that are free:
    growing one router at once into what another is giving up would let the fleet hold more
    than the limit for as long as that one's streams last.

    What a router may hold is the larger of its old share (it admits up to that until the new
    table reaches it) and what it last reported holding. `reported`: the most it wanted at
    once in its last report, one more than it held when that was more than its share (a
    refusal), else what it held. An increase waits for a later publication where the slots
    are not free yet. `unacked`: router -> a larger share an earlier table gave it, which it
    may still admit up to: the table that lowered it has not reached it yet (its reports
    have not acknowledged that version). `holding`: router -> its requests in flight, as its
    last report said (routers that say it)."""
    # A router the last table did not name holds none (routers deal max_in_flight strictly:
    # router/tenancy/tenants.py), unless it says otherwise.
    unacked = unacked or {}
    before = {
        r: max(old[r][2] if r in old and old[r][2] is not None else 0, unacked.get(r, 0))
        for r in fresh
    }
    holding = holding or {}
    committed = {}
    for router in fresh:
        want = reported.get(router)
        held = before[router]
        if router in holding:  # it says what it holds (its requests in flight)
            held = math.ceil(holding[router])
        elif want is not None:  # an older router: from what it wanted at once
            want = math.ceil(want)
            held = want - 1 if want > before[router] else want
        committed[router] = max(before[router], held)
    free = limit - sum(committed.values())
    given = {}
    for router in sorted(fresh):
        share = fresh[router]
        if share > committed[router]:
            grown = min(share - committed[router], max(free, 0))
            free -= grown
            share = committed[router] + grown
        given[router] = share
    return given


def split_whole(limit: int, demands: dict[str, float]) -> dict[str, int]:
    """`limit` whole requests in flight among routers: each at least one, the rest in
    proportion to demand (largest remainders first, ties by name)."""
    rest = max(0, limit - len(demands))
    wanted = sum(demands.values())
    exact = {r: rest * (d / wanted if wanted > 0 else 1 / len(demands)) for r, d in demands.items()}
    given = {r: 1 + math.floor(x) for r, x in exact.items()}
    left = rest - sum(g - 1 for g in given.values())
    for r in sorted(exact, key=lambda r: (-(exact[r] - math.floor(exact[r])), r))[:left]:
        given[r] += 1
    return given


def by_demand(capacity: float, wants: dict[str, float]) -> dict[str, float]:
    """In proportion to what each wants when together they want more than `capacity`; else
    what each wants, and what nobody wants spread evenly, so that a router's next burst finds
    room."""
    wanted = sum(wants.values())
    if wanted > capacity:
        return {key: capacity * want / wanted for key, want in wants.items()}
    spare = (capacity - wanted) / len(wants)
    return {key: want + spare for key, want in wants.items()}


# The store's rows (records): usage by minute, each router's usage base, each tenant's shares
# as last published.
MINUTE_ROW, BASE_ROW, SHARES_ROW = "usage_minute/", "usage_base/", "tenant_shares/"


class TenantLedger:
    """What routers report per tenant: demand rates per router, usage in minute buckets.

    Usage is kept in the store, not only in the leader's memory: the minute buckets, and per
    router the counters of its incarnation as last taken (its base). A report adds what its
    counters grew since the base of the same incarnation, whichever leader took the base and
    however long the router was silent; only a new incarnation starts from zero. So a failover
    or a partition adds deltas, never a router's lifetime, and no minute reported is lost
    (the rows are written before the report is answered).

    The shares last published are kept in the store too: a new leader has no demand rates
    until each router has reported twice, and splitting by nothing would drop every router to
    its floor. It publishes the shares it inherited, unchanged, until every router they name
    has reported a rate to it or left (`inherited`)."""

    def __init__(self) -> None:
        # router -> (incarnation, wall time, {tenant: {"demand": [...], "usage": {...}}})
        self.last: dict[str, tuple[str, float, dict]] = {}
        # router -> {"incarnation", "at", "counters"}: what its usage counts from
        self.bases: dict[str, dict] = {}
        self.dirty: set[str] = set()  # rows to write
        self.demand: dict[str, dict[str, list[float]]] = {}  # tenant -> router -> [rpm, tpm]
        self.minutes: deque = deque()  # (minute start, {(tenant, model): [USAGE_FIELDS]})
        # hour start -> its minutes summed, for hours no report writes to any more: a day's
        # usage adds 24 of them and the minutes of the hour under way, not 1,440 minutes.
        self.hour_sums: dict[float, dict] = {}
        self.keys_used: dict[str, float] = {}  # key id -> wall time last used
        self.published: dict[str, dict[str, list[float]]] = {}  # tenant -> router -> shares
        self.published_at: dict[str, float] = {}  # tenant -> when its shares last moved
        self.spared: dict[str, list[bool]] = {}  # tenant -> `spare` as its shares were dealt
        # tenant -> router -> the most requests in flight it wanted at once: since the last
        # publication, and as last used
        self.wanted: dict[str, dict[str, float]] = {}
        self.wanted_used: dict[str, dict[str, float]] = {}
        self.rate_base: dict[str, tuple[str, float, dict]] = {}  # router -> a rate's start
        self.inherited: set[str] = set()  # tenants whose shares a former leader published
        # tenant -> router -> (a share of max_in_flight it had, the table version that lowered
        # it; None until published): held until the router acknowledges that version
        self.lowered: dict[str, dict[str, tuple[int, int | None]]] = {}
        self.acked: dict[str, int] = {}  # router -> the route version its last report held
        self.held: dict[str, dict[str, float]] = {}  # tenant -> router -> in flight, last said
        self.first_report_at = 0.0  # when this ledger took its first report
        self.clock = 0.0  # the newest report's time

    def check(self, body) -> dict:
        """A report's `tenants` and `keys_used` parsed, or ReportError naming the field."""
        if not isinstance(body, dict):
            return {}
        keys = body.get("keys_used", {})
        if not isinstance(keys, dict) or not all(
            isinstance(k, str) and _number(v) for k, v in keys.items()
        ):
            raise ReportError("keys_used", "expected {key id: wall time}")
        return parse_tenants(body.get("tenants", {}))

    def report(self, body: dict, counters: dict, now: float) -> None:
        """Take one router's report, checked: its tenants' `counters` from `check`."""
        router, incarnation = body["router"], body.get("incarnation", "")
        for key_id, at in body.get("keys_used", {}).items():
            self.keys_used[key_id] = max(at, self.keys_used.get(key_id, 0.0))
        if not self.last and not self.clock:
            self.first_report_at = now
        self.clock = max(self.clock, now)
        self.last[router] = (incarnation, now, counters)
        self.acked[router] = body.get("route_version", -1)
        previous = self.rate_base.get(router)
        before, since = {}, None  # no rate from one report, nor over a gap under MIN_RATE_S
        if previous is None or previous[0] != incarnation:
            self.rate_base[router] = (incarnation, now, counters)
        elif now - previous[1] >= MIN_RATE_S:
            before, since = previous[2], previous[1]
            self.rate_base[router] = (incarnation, now, counters)
        base = self.bases.get(router)
        # Usage counts from the base of the same incarnation, stored; a new one from zero.
        counted = base["counters"] if base and base["incarnation"] == incarnation else {}
        self.bases[router] = {"incarnation": incarnation, "at": now, "counters": counters}
        self.dirty.add(BASE_ROW + router)
        bucket = self._bucket(now)
        for tenant, now_counts in counters.items():
            if now_counts.get("wanted") is not None:
                into = self.wanted.setdefault(tenant, {})
                into[router] = max(into.get(router, 0.0), now_counts.get("wanted"))
            if now_counts.get("held") is not None:
                self.held.setdefault(tenant, {})[router] = now_counts["held"]
            was = before.get(tenant, {"demand": [0.0, 0.0], "usage": {}})
            if since is not None and now > since:
                per_minute = 60.0 / (now - since)
                rates = [
                    max(0.0, a - b) * per_minute
                    for a, b in zip(now_counts["demand"], was["demand"], strict=True)
                ]
                kept = self.demand.setdefault(tenant, {}).get(router)
                if kept is not None:
                    rates = [
                        DEMAND_SMOOTHING * r + (1 - DEMAND_SMOOTHING) * k
                        for r, k in zip(rates, kept, strict=True)
                    ]
                self.demand[tenant][router] = rates
            from_base = counted.get(tenant, {"usage": {}})["usage"]
            for model, values in now_counts["usage"].items():
                old = from_base.get(model, [0.0] * len(USAGE_FIELDS))
                into = bucket.setdefault((tenant, model), [0.0] * len(USAGE_FIELDS))
                for i, (a, b) in enumerate(zip(values, old, strict=True)):
                    into[i] += a - b if a >= b else a  # counters that went back restarted
        self._forget_old(now)

    def _bucket(self, now: float) -> dict:
        minute = math.floor(now / 60.0) * 60.0
        if not self.minutes or self.minutes[-1][0] != minute:
            if self.minutes and _hour(self.minutes[-1][0]) < _hour(minute):
                self._sum_hour(_hour(self.minutes[-1][0]))  # now, not in a usage call
            self.minutes.append((minute, {}))
        self.dirty.add(f"{MINUTE_ROW}{int(minute)}")
        self.hour_sums.pop(_hour(minute), None)  # a clock set back writes to a summed hour
        return self.minutes[-1][1]

    def _forget_old(self, now: float) -> None:
        while self.minutes and self.minutes[0][0] < now - USAGE_KEPT_S:
            minute, _ = self.minutes.popleft()
            self.dirty.add(f"{MINUTE_ROW}{int(minute)}")
            self.hour_sums.pop(_hour(minute), None)
        for router in [r for r, b in self.bases.items() if now - b["at"] > USAGE_KEPT_S]:
            del self.bases[router]
            self.dirty.add(BASE_ROW + router)
        for router in [r for r, (_, at, _) in self.last.items() if now - at > ROUTER_GONE_S]:
            del self.last[router]
            self.rate_base.pop(router, None)
            self.acked.pop(router, None)
            for by_tenant in (self.demand, self.wanted, self.wanted_used, self.lowered,
                              self.held):  # fmt: skip
                for per_router in by_tenant.values():
                    per_router.pop(router, None)

    # The store's rows.

    def load(self, rows: dict[str, bytes]) -> None:
        """Minute buckets and bases from the store's rows (a new leader's, or a restart's)."""
        minutes = []
        for key, body in rows.items():
            if key.startswith(MINUTE_ROW):
                bucket = {tuple(k.split("\t", 1)): v for k, v in orjson.loads(body).items()}
                minutes.append((float(key[len(MINUTE_ROW) :]), bucket))
            elif key.startswith(BASE_ROW):
                self.bases[key[len(BASE_ROW) :]] = orjson.loads(body)
            elif key.startswith(SHARES_ROW):
                tenant = key[len(SHARES_ROW) :]
                self.published[tenant] = orjson.loads(body)
                self.inherited.add(tenant)
        self.minutes = deque(sorted(minutes, key=lambda m: m[0]))
        self.hour_sums.clear()

    def take_dirty_rows(self) -> dict[str, bytes | None]:
        """key -> the row to write (None: delete it), for what changed since the last call."""
        rows: dict[str, bytes | None] = {}
        for key in self.dirty:
            if key.startswith(MINUTE_ROW):
                bucket = self._minute(float(key[len(MINUTE_ROW) :]))
                rows[key] = (
                    None
                    if bucket is None
                    else orjson.dumps({"\t".join(k): v for k, v in bucket.items()})
                )
            elif key.startswith(SHARES_ROW):
                shares = self.published.get(key[len(SHARES_ROW) :])
                rows[key] = None if shares is None else orjson.dumps(shares)
            else:
                base = self.bases.get(key[len(BASE_ROW) :])
                rows[key] = None if base is None else orjson.dumps(base)
        self.dirty.clear()
        return rows

    def _minute(self, start: float) -> dict | None:
        """The bucket of the minute beginning at `start`: the newest ones are the written ones,
        so the search runs from the end."""
        for minute, bucket in reversed(self.minutes):
            if minute == start:
                return bucket
            if minute < start:
                return None
        return None

    def forget_tenant(self, tenant: str) -> None:
        for by_tenant in (self.demand, self.published, self.published_at, self.wanted,
                          self.wanted_used, self.lowered, self.held, self.spared):  # fmt: skip
            by_tenant.pop(tenant, None)
        self.inherited.discard(tenant)
        self.dirty.add(SHARES_ROW + tenant)

    def usage(self, since_s: float, now: float) -> list[dict]:
        """Rows per (tenant, model) over the last `since_s` seconds, by tenant then model: the
        minutes that end after `now - since_s`; an hour inside the window and over is added
        as its sum, made once."""
        start = now - since_s
        current_hour = _hour(math.floor(now / 60.0) * 60.0)
        totals: dict[tuple[str, str], list[float]] = {}
        whole: set[float] = set()
        for minute, bucket in self.minutes:
            if minute + 60.0 <= start:
                continue
            hour = _hour(minute)
            if hour + 60.0 > start and hour < current_hour:
                whole.add(hour)
            else:  # an hour the window cuts, or the one under way
                _add_bucket(totals, bucket)
        for hour in whole:
            summed = self.hour_sums.get(hour)
            _add_bucket(totals, self._sum_hour(hour) if summed is None else summed)
        return [
            {"tenant": tenant, "model": model, **usage_row(values)}
            for (tenant, model), values in sorted(totals.items())
        ]

    def _sum_hour(self, hour: float) -> dict:
        summed: dict[tuple[str, str], list[float]] = {}
        for minute, bucket in self.minutes:
            if _hour(minute) == hour:
                _add_bucket(summed, bucket)
        self.hour_sums[hour] = summed
        return summed

    def askers(self, tenant: str) -> list[str]:
        """The live routers that have asked for `tenant` since they started."""
        return sorted(
            router
            for router, (_, _, counters) in self.last.items()
            if counters.get(tenant, {}).get("demand", [0.0])[0] > 0
        )

    def shares(
        self, tenant: str, rpm: int | None, tpm: int | None, in_flight: int | None = None
    ) -> dict[str, list]:
        """router -> [requests share, tokens share per minute, requests in flight] (None:
        that limit is off), for the routers that asked for the tenant; moved only when a
        router's share changed by more than SHARE_CHANGE of the limit."""
        demands = self.demand.get(tenant, {})
        old = self.published.get(tenant, {})
        if tenant in self.inherited:
            heard_for = self.clock - self.first_report_at if self.last else 0.0
            if heard_for < ROUTER_GONE_S and any(r not in demands for r in old):
                return old  # a former leader's, until its routers' rates are known here
            self.inherited.discard(tenant)
        routers = self.askers(tenant)
        if not routers or not (rpm or tpm or in_flight):
            self.spared.pop(tenant, None)
            if self.published.pop(tenant, None) is not None:
                self.dirty.add(SHARES_ROW + tenant)
            return {}
        same_routers = sorted(old) == routers
        held = self.clock - self.published_at.get(tenant, -math.inf) < SHARE_HOLD_S
        if same_routers and held and not self._waiting_for_slots(tenant, old):
            return old
        asked = {r: demands.get(r, [0.0, 0.0]) for r in routers}
        dealt = 1.0 - RESERVED_SHARE
        by_requests = split(rpm * dealt, {r: asked[r][0] for r in routers}) if rpm else {}
        by_tokens = split(tpm * dealt, {r: asked[r][1] for r in routers}) if tpm else {}
        by_flight = self._split_in_flight(tenant, in_flight, routers, old) if in_flight else {}
        fresh = {r: [by_requests.get(r), by_tokens.get(r), by_flight.get(r)] for r in routers}
        if same_routers and all(
            _close(old[r][0], fresh[r][0], rpm)
            and _close(old[r][1], fresh[r][1], tpm)
            and old[r][2] == fresh[r][2]
            for r in routers
        ):
            return old
        rounded = {r: [_round(v) for v in values] for r, values in fresh.items()}
        self.spared[tenant] = self._spare_now(tenant, rpm, tpm)
        self.published[tenant] = rounded
        self.dirty.add(SHARES_ROW + tenant)
        self.published_at[tenant] = self.clock
        return rounded

    def spare(self, tenant: str) -> list[bool]:
        """Whether the routers asking for `tenant` together asked for less than is dealt of
        each rate when its shares were last dealt: a router over its share may then wait for
        it to grow, where otherwise the limit is reached fleet-wide and the answer is 429.
        Taken with the shares, so it moves no more often than they do; not known (shares a
        former leader dealt), no: the answer is 429 as before waiting was possible."""
        return self.spared.get(tenant, [False, False])

    def _spare_now(self, tenant: str, rpm: int | None, tpm: int | None) -> list[bool]:
        demands = self.demand.get(tenant, {}).values()
        return [
            bool(limit) and sum(rates[i] for rates in demands) < limit * (1.0 - RESERVED_SHARE)
            for i, limit in enumerate((rpm, tpm))
        ]

    def _waiting_for_slots(self, tenant: str, old: dict) -> bool:
        """Whether a router wanted more requests in flight than its share since the last
        publication: its requests wait for the share (router/tenancy/tenants.py SHARE_WAIT_S), so
        the split is not held back."""
        for router, want in self.wanted.get(tenant, {}).items():
            share = old.get(router)
            if share is not None and share[2] is not None and want > share[2]:
                return True
        return False

    def _split_in_flight(self, tenant: str, limit: int, routers: list[str], old: dict) -> dict:
        """split_fair by what each router wanted since the last publication (else as last
        used): one that wanted more than it was given (it refused a request) wants more."""
        since = self.wanted.pop(tenant, {})
        used = self.wanted_used.setdefault(tenant, {})
        wanted: dict[str, float | None] = {}
        for router in routers:
            want = since.get(router, used.get(router))
            given = old[router][2] if router in old and old[router][2] is not None else 0
            if want is None:  # a router that does not say (older ones): as if it wants more
                wanted[router] = None
                continue
            used[router] = want
            wanted[router] = None if want > given else want
        unacked = self._unacked(tenant)
        holding = self.held.get(tenant, {})
        given = grown_into_free_slots(
            limit, split_fair(limit, wanted), old, used, unacked, holding
        )
        lowered = self.lowered.setdefault(tenant, {})
        for router, share in given.items():
            had = max(old[router][2] if router in old and old[router][2] else 0,
                      unacked.get(router, 0))  # fmt: skip
            if share < had:
                lowered[router] = (had, None)  # its version is known once it is published
        return given

    def _unacked(self, tenant: str) -> dict[str, int]:
        """router -> the largest share of `tenant`'s max_in_flight a table gave it before
        one that lowered it, while it has not acknowledged that table."""
        lowered = self.lowered.get(tenant, {})
        for router, (_, version) in list(lowered.items()):
            if version is not None and self.acked.get(router, -1) >= version:
                del lowered[router]
        return {router: share for router, (share, _) in lowered.items()}

    def published_in(self, version: int) -> None:
        """The shares just dealt went out in routing table `version`."""
        for lowered in self.lowered.values():
            for router, (share, at) in lowered.items():
                if at is None:
                    lowered[router] = (share, version)


def _close(old, new, limit) -> bool:
    if old is None or new is None:
        return old is new
    return abs(old - new) <= SHARE_CHANGE * limit


def _round(value):
    return None if value is None else round(value, 3)


def _hour(minute: float) -> float:
    return math.floor(minute / 3600.0) * 3600.0


def _add_bucket(totals: dict, bucket: dict) -> None:
    for key, values in bucket.items():
        into = totals.setdefault(key, [0.0] * len(USAGE_FIELDS))
        for i, value in enumerate(values):
            into[i] += value


def usage_row(values: list[float]) -> dict:
    row = dict(zip(USAGE_FIELDS, values, strict=True))
    for name in USAGE_FIELDS[:-1]:
        row[name] = int(round(row[name]))
    row["queue_wait_s"] = round(row["queue_wait_s"], 3)
    return row


def _number(value) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


def parse_tenants(value) -> dict:
    """A report's `tenants`: {tenant: {"demand": [requests, tokens, in flight wanted],
    "in_flight": requests it holds now, "usage": {model: [USAGE_FIELDS]}}}, counters since
    the router started; ReportError otherwise. `in_flight` is a field of its own, not a
    fourth demand: a control plane of the version before refuses a demand of four whole."""
    if not isinstance(value, dict):
        raise ReportError("tenants", "expected {tenant: {demand, usage}}")
    parsed = {}
    for tenant, entry in value.items():
        demand = entry.get("demand") if isinstance(entry, dict) else None
        usage = entry.get("usage", {}) if isinstance(entry, dict) else None
        if (
            not isinstance(tenant, str)
            or not isinstance(demand, list)
            or len(demand) not in (2, 3)
            or not (entry.get("in_flight") is None or _number(entry.get("in_flight")))
            or not all(_number(v) for v in demand)
            or not isinstance(usage, dict)
        ):
            raise ReportError(
                "tenants",
                f"{tenant!r}: expected demand [requests, tokens, in flight wanted] and in_flight"
                " a number",
            )
        for model, values in usage.items():
            if (
                not isinstance(values, list)
                or len(values) != len(USAGE_FIELDS)
                or not all(_number(v) for v in values)
            ):
                raise ReportError(
                    "tenants", f"{tenant!r}, {model!r}: usage is {list(USAGE_FIELDS)}"
                )
        parsed[tenant] = {
            "demand": [float(demand[0]), float(demand[1])],
            "wanted": float(demand[2]) if len(demand) == 3 else None,
            "held": None if entry.get("in_flight") is None else float(entry["in_flight"]),
            "usage": usage,
        }
    return parsed


def tenant_table(tenants: dict, keys: dict, ledger: TenantLedger, auth: str = "") -> dict:
    """What routers get with the routes: whether a request needs a tenant's key (`auth`),
    each tenant's rules and shares, and key digests."""
    if not tenants and auth != "tenants":
        return {}
    return {
        "auth": auth or "tenants",
        "share_lease_s": SHARE_LEASE_S,
        "floor_share": FLOOR_SHARE,
        "reserved_share": RESERVED_SHARE,
        "routers": max(1, len(ledger.last)),
        "tenants": {
            tenant.name: {
                "models": tenant.models,
                "requests_per_minute": tenant.requests_per_minute,
                "tokens_per_minute": tenant.tokens_per_minute,
                "max_in_flight": tenant.max_in_flight,
                "weight": tenant.weight,
                "priority": tenant.priority,
                "default_max_tokens": tenant.default_max_tokens,
                # max_in_flight dealt strictly: a router not named holds none of it, and a
                # request over a share waits for it to grow (router/tenancy/tenants.py)
                "strict_in_flight": True,
                "shares": ledger.shares(
                    tenant.name,
                    tenant.requests_per_minute,
                    tenant.tokens_per_minute,
                    tenant.max_in_flight,
                ),
                "spare": ledger.spare(tenant.name),  # as the shares just dealt found it
            }
            for tenant in sorted(tenants.values(), key=lambda t: t.name)
        },
        "keys": {
            key.digest: [key.tenant, key.id]
            for key in sorted(keys.values(), key=lambda k: k.id)
            if key.tenant in tenants
        },
    }

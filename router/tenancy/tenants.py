"""Tenants at the router: whose a key is, what the tenant may call, and its share of each limit.

The control plane sends, with the routes, each tenant's rules, this router's share of each
per-minute limit, and the SHA-256 of every key (controlplane/rules/tenantshares.py). A request's
key is found with one hash and one lookup. Each limit is a bucket per tenant that fills at
this router's share per minute and holds at most a minute of it:
- requests: one per request;
- tokens: a request is admitted while the bucket is above zero and takes its estimate (the
  prompt's bytes / 4 plus its top-level `max_completion_tokens`, else `max_tokens`, else the
  tenant's `default_max_tokens`, which is then written into the body the engine gets, so
  that it cannot generate more than was admitted); one whose estimate is more than the
  tenant's whole minute is refused at once; when the answer ends the engine's `usage`
  replaces the estimate;
- in flight: this router's share of `max_in_flight`.
A share holds while the lease from the last word of the control plane runs; after it, the
floor (a router cut off cannot go on spending a share the others were given meanwhile).

The floor of a rate is a router's part of what the control plane keeps aside of the limit
(`reserved_share` of it) for the routers it has not named yet or has lost: that part split over
every router it hears (`routers`). A router not named starts with nothing in its rate buckets:
the routers heard when the table was made may be far fewer than those that begin to ask at
once (a fleet starting, sixteen workers started together), and a minute of the floor each
would then add up past what is kept aside; its requests wait to be named instead, a few
tenths of a second after it first asks. A named router's buckets start with a second of its
share, not a minute. A request
over the share waits for it to grow (SHARE_WAIT_S) where it can: max_in_flight always (dealt
on demand), a rate while this router is not named yet or the control plane says the tenant's
fleet-wide total is not reached (`spare`); otherwise 429.

Typed in tenants.pxd: compiled, the lookup and the checks are C calls.
"""

from __future__ import annotations

import fnmatch
import hashlib
import time

from router.protocol.wire import ratelimit_lines

KEYS_FILE_TENANT = "api-keys-file"  # --api-keys-file's keys: a tenant with no limits
MAX_KNOWN = 100_000  # headers remembered (each a valid key)
MAX_AUTHORIZATION = 1024  # longer is no key of ours: refused before it is hashed
BYTES_PER_TOKEN = 4  # a prompt's estimate: its bytes over this (English, JSON around it)
MODELS_REMEMBERED = 4096  # per tenant: may_call's answers kept (models are few)
PROMPT_TOKENS = b'"prompt_tokens"'  # the engine's usage, as OpenAI names it
COMPLETION_TOKENS = b'"completion_tokens"'
USAGE_WIDTH = 6  # requests, errors, rate_limited, prompt_tokens, completion_tokens, queue_wait_s
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0)
# Why a request was refused, as admit() returns it (0: admitted).
ADMITTED, OVER_REQUESTS, OVER_TOKENS, OVER_IN_FLIGHT = 0, 1, 2, 3
LIMIT_NAMES = {
    OVER_REQUESTS: "requests per minute",
    OVER_TOKENS: "tokens per minute",
    OVER_IN_FLIGHT: "requests in flight",
}
# A request over this router's share of max_in_flight waits this long at most (or the park
# timeout, if shorter) for the share to grow: the router reports at once, the control plane
# answers with a table, a round trip of about a second; past it, the limit is reached.
SHARE_WAIT_S = 3.0


# What a request says it may generate (completion_bound), besides a whole number.
NO_BOUND = -1  # it names none, or null
BAD_BOUND = -2  # it names one that is not a whole number of tokens
MOST_TOKENS = 10**18


def completion_bound(payload) -> int:
    """What a request may generate as vLLM reads it: the top-level `max_completion_tokens`,
    else `max_tokens` (nested ones are a message's, not the request's). `payload`: the
    scanned body's fields, the body parsed as a dict, or None for a body that is no JSON."""
    if payload is None:
        return NO_BOUND
    if type(payload) is not dict:
        fields = payload  # the scan's fields: compiled, a C call
        return fields.completion_bound()
    for name in ("max_completion_tokens", "max_tokens"):
        value = payload.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 0 or value >= MOST_TOKENS:
            return BAD_BOUND
        return value
    return NO_BOUND


def tokens_asked(body_bytes: int, bound: int) -> int:
    """A request's estimate: its prompt (the body's bytes / 4) plus what it may generate."""
    per_token = BYTES_PER_TOKEN  # compiled, a C integer: the division is C's, not Python's
    return body_bytes // per_token + bound


class Bucket:
    """`rate` per minute, holding at most a minute of it (and at least `least`, so that a share
    of less than one request a minute still admits one in its time); `level` may go below
    zero (a request's tokens are taken whole once the bucket is above zero).

    A new bucket starts with `start` (the fixed allowance of a router new to the tenant), not
    a minute of its share: a router that restarts, or a worker that is replaced, would
    otherwise hand out a whole minute's share again each time, on top of what its last
    incarnation spent."""

    def __init__(self, per_minute: float, now: float, start: float, least: float = 0.0) -> None:
        self.per_minute = per_minute
        self.least = least
        self.level = min(max(start, least), max(per_minute, least))
        self.at = now

    def fill(self, per_minute: float, now: float) -> None:
        if per_minute != self.per_minute:
            self.per_minute = per_minute
        most = per_minute if per_minute > self.least else self.least
        elapsed = now - self.at
        self.at = now
        if elapsed > 0:
            self.level = min(most, self.level + elapsed * per_minute / 60.0)
        elif self.level > most:
            self.level = most

    def wait_for(self, need: float) -> float:
        """Seconds until the level reaches `need`."""
        if self.per_minute <= 0:
            return 60.0
        return max(0.001, (need - self.level) * 60.0 / self.per_minute)


class UsageRow:
    """One tenant's answers for one model, counted since the router started: requests
    admitted, of them the errors, and requests refused by a limit."""

    def __init__(self) -> None:
        self.requests = self.errors = self.rate_limited = 0.0
        self.prompt_tokens = self.completion_tokens = self.queue_wait_s = 0.0
        self.ok = 0  # answers 200: the common code, counted apart from the dict of others
        self.codes: dict = {}  # status -> answers

    def as_list(self) -> list:
        """In the order of a report (USAGE_WIDTH)."""
        return [
            self.requests,
            self.errors,
            self.rate_limited,
            self.prompt_tokens,
            self.completion_tokens,
            self.queue_wait_s,
        ]

    def by_code(self) -> dict:
        codes = dict(self.codes)
        if self.ok:
            codes[200] = self.ok
        return codes


class TenantState:
    """One tenant as this router holds it: rules, shares, buckets and counters."""

    def __init__(self, name: str, now: float) -> None:
        """Unusable until `configure`d."""
        self.name = name
        self.patterns: tuple = ()
        self.allowed: dict = {}
        self.requests_per_minute = 0.0  # fleet-wide limits (0: none)
        self.tokens_per_minute = 0.0
        self.max_in_flight = 0
        self.weight = 1.0
        self.priority = 0
        self.default_max_tokens = 256
        self.limited = False
        self.requests_prefix = self.tokens_prefix = b""  # of their x-ratelimit-* lines
        self._forget_lines()
        # This router's share of each limit, and the floor it falls to when its lease ends.
        self.share_requests = self.share_tokens = self.floor_requests = self.floor_tokens = 0.0
        self.share_in_flight = self.floor_in_flight = 1
        # Named in the table's shares; whether the fleet-wide total of each rate is not reached.
        self.named = False
        self.spare_requests = self.spare_tokens = False
        self.waiting = 0  # its requests waiting here for this router's share to grow
        self.requests = None  # Buckets, made full at the first share
        self.tokens = None
        self.created = now
        self.in_flight = 0
        self.demand_requests = 0.0  # asked of this router since it started, admitted or not
        self.demand_tokens = 0.0
        # The most requests in flight at once it held or was asked to hold since the last
        # report: what the control plane splits max_in_flight by.
        self.wanted_in_flight = 0
        self.usage: dict = {}  # model -> UsageRow
        self.last_model, self.last_row = None, None  # the model counted last, and its row
        self.waits: dict = {}  # model -> [count per WAIT_BUCKETS bucket, +Inf, sum]
        # A tenants file's max_in_flight held by a router's workers together
        # (router/tenancy/inflight.py): the counter, this tenant's cell in it (-1: none),
        # and how many of the requests this worker holds are counted there.
        self.shared = None
        self.shared_cell = -1
        self.shared_held = 0

    def configure(
        self,
        rules: dict,
        share,
        floor_share: float,
        askers: int,
        routers: int = 0,
        reserved_share: float = 0.0,
    ) -> None:
        """`rules`: the tenant's part of the table (with `strict_in_flight` from a control
        plane that deals max_in_flight strictly, and `spare`). `askers`: the routers named in
        its shares; `routers`: every router the control plane hears (0: not said), which
        share `reserved_share` of each rate while not named."""
        self.patterns = tuple(rules.get("models") or ())
        self.allowed = {}
        self.requests_per_minute = float(rules.get("requests_per_minute") or 0)
        self.tokens_per_minute = float(rules.get("tokens_per_minute") or 0)
        self.max_in_flight = int(rules.get("max_in_flight") or 0)
        self.weight = float(rules.get("weight") or 1.0)
        self.priority = int(rules.get("priority") or 0)
        self.default_max_tokens = int(rules.get("default_max_tokens") or 256)
        self.limited = bool(
            self.requests_per_minute or self.tokens_per_minute or self.max_in_flight
        )
        self.requests_prefix = _header_prefix(b"requests", self.requests_per_minute)
        self.tokens_prefix = _header_prefix(b"tokens", self.tokens_per_minute)
        self._forget_lines()
        limits = (self.requests_per_minute, self.tokens_per_minute, float(self.max_in_flight))
        floor = [min(limit * floor_share, limit / max(askers, 1)) for limit in limits]
        if routers:  # the part kept aside for routers not named, split over all of them
            floor[0] = limits[0] * (reserved_share or floor_share) / routers
            floor[1] = limits[1] * (reserved_share or floor_share) / routers
        spare = rules.get("spare") or (False, False)
        self.spare_requests, self.spare_tokens = bool(spare[0]), bool(spare[1])
        newly_named = share is not None and not self.named
        self.named = share is not None
        given = floor
        if share is not None:
            given = [
                float(share[i]) if i < len(share) and share[i] is not None else floor[i]
                for i in range(3)
            ]
        self.share_requests, self.share_tokens = given[0], given[1]
        self.floor_requests, self.floor_tokens = floor[0], floor[1]
        # A floor of one request per router would grow with routers (16 routers, 16 in
        # flight, whatever the limit): where the control plane deals shares strictly, a router
        # it has not named, or whose lease ran out, holds none of max_in_flight, and a request
        # waits for its share (SHARE_WAIT_S) instead.
        strict = bool(rules.get("strict_in_flight"))
        self.floor_in_flight = int(floor[2]) if strict else max(1, int(floor[2]))
        dealt = share is not None and len(share) > 2 and share[2] is not None
        # A share dealt in whole requests may be none: workers of a file's tenant hold its
        # max_in_flight between them, and fewer requests than workers leave some without.
        self.share_in_flight = int(given[2]) if dealt else self.floor_in_flight
        if self.requests is None:
            # A second of the share. Not named by a control plane: nothing, the requests wait
            # to be named (a minute of the floor each, where more routers begin at once than
            # the table counted, adds up past what is kept aside); without one, the floor's
            # minute.
            start = [given[0] / 60, given[1] / 60] if self.named else floor
            if routers and not self.named:
                start = [0.0, 0.0]
            self.requests = Bucket(given[0], self.created, start[0], 1.0 if self.named else 0.0)
            self.tokens = Bucket(given[1], self.created, start[1])
        else:
            # A share under one request a minute still admits one in its time; the floor of a
            # router not named does not (it waits to be named), or it would grow with routers.
            self.requests.least = 1.0 if self.named else 0.0
            if newly_named:  # what it would have started with, named at once
                self.requests.level = max(self.requests.level, given[0] / 60)
                self.tokens.level = max(self.tokens.level, given[1] / 60)

    def may_call(self, model: str) -> bool:
        if not self.patterns:
            return True
        known = self.allowed.get(model)
        if known is None:
            known = False
            for pattern in self.patterns:
                if fnmatch.fnmatchcase(model, pattern):
                    known = True
                    break
            if len(self.allowed) < MODELS_REMEMBERED:
                self.allowed[model] = known
        return known

    def admit(self, now: float, tokens: float, leased: bool) -> int:
        """ADMITTED (and counted in flight), or which limit refuses the request; counted as
        asked for, once."""
        self.demand_requests += 1
        self.demand_tokens += tokens
        asking = self.in_flight + self.waiting + 1
        if asking > self.wanted_in_flight:
            self.wanted_in_flight = asking
        return self._take(now, tokens, leased)

    def may_wait(self, refused: int) -> bool:
        """Whether a request refused by this router's share (`refused`) may wait for the
        share to grow, the control plane dealing shares on demand."""
        if refused == OVER_IN_FLIGHT or not self.named:
            return True
        return self.spare_requests if refused == OVER_REQUESTS else self.spare_tokens

    def take(self, now: float, tokens: float, leased: bool) -> int:
        """admit() for a request already counted as asked for (one that waited)."""
        return self._take(now, tokens, leased)

    def _take(self, now: float, tokens: float, leased: bool) -> int:
        # A C call from admit (compiled): a cpdef method called on self checks each time
        # whether Python overrides it, which cost the tenant path 2-3% per core.
        if leased:
            requests, most = self.share_requests, self.share_in_flight
            tokens_share = self.share_tokens
        else:
            requests, most = self.floor_requests, self.floor_in_flight
            tokens_share = self.floor_tokens
        if self.max_in_flight and self.shared_cell < 0 and self.in_flight >= most:
            return OVER_IN_FLIGHT
        if self.requests_per_minute:
            self.requests.fill(requests, now)
            if self.requests.level < 1.0:
                return OVER_REQUESTS
        if self.tokens_per_minute:
            self.tokens.fill(tokens_share, now)
            if self.tokens.level <= 0.0:
                return OVER_TOKENS
        if self.max_in_flight and self.shared_cell >= 0:
            # The workers' count, taken last: nothing is to be given back when a rate refuses.
            if not self.shared.acquire(self.shared_cell, self.max_in_flight):
                return OVER_IN_FLIGHT
            self.shared_held += 1
        if self.tokens_per_minute:
            self.tokens.level -= tokens
        if self.requests_per_minute:
            self.requests.level -= 1.0
        self.in_flight += 1
        return ADMITTED

    def retry_after(self, refused: int) -> float:
        if refused == OVER_REQUESTS:
            return self.requests.wait_for(1.0)
        if refused == OVER_TOKENS:
            return self.tokens.wait_for(0.001)
        return 1.0  # in flight: as soon as one ends

    def settle(self, reserved: float, used: float) -> None:
        """An admitted request ended: its tokens are what the engine said, not the estimate."""
        self.in_flight -= 1
        if self.shared_held > 0:
            self.shared_held -= 1
            self.shared.release(self.shared_cell)
        if self.tokens_per_minute:
            self.tokens.level = min(self.tokens.per_minute, self.tokens.level + reserved - used)

    def count(
        self, model: str, status: int, prompt: int, completion: int, refused: bool, waited: float
    ) -> None:
        if model is self.last_model:  # most answers are for the model of the one before
            row = self.last_row
        else:
            row = self.usage.get(model)
            if row is None:
                row = self.usage[model] = UsageRow()
            self.last_model, self.last_row = model, row
        # Three apart: admitted (`requests`), refused by a limit (`rate_limited`), and the
        # admitted that failed (`errors`): a refusal is neither of the other two.
        if refused:
            row.rate_limited += 1
        else:
            row.requests += 1
            if status >= 400:
                row.errors += 1
        row.prompt_tokens += prompt
        row.completion_tokens += completion
        if status == 200:
            row.ok += 1
        else:
            row.codes[status] = row.codes.get(status, 0) + 1
        if waited > 0:
            row.queue_wait_s += waited
            self.observe_wait(model, waited)

    def observe_wait(self, model: str, waited: float) -> None:
        counts = self.waits.get(model)
        if counts is None:
            counts = self.waits[model] = [0] * (len(WAIT_BUCKETS) + 1) + [0.0]
        index = 0
        while index < len(WAIT_BUCKETS) and waited > WAIT_BUCKETS[index]:
            index += 1
        counts[index] += 1
        counts[-1] += waited

    def limit_headers(self) -> bytes:
        """OpenAI's x-ratelimit-* lines for this router's buckets (after the last admit). The
        lines said last are said again while their four numbers stay: a tenant well under its
        limits keeps its buckets full, and its answers, one after the other, the same lines."""
        requests_left = requests_reset = tokens_left = tokens_reset = 0
        if self.requests_per_minute:
            requests_left = _left(self.requests)
            requests_reset = _reset_ms(self.requests)
        if self.tokens_per_minute:
            tokens_left = _left(self.tokens)
            tokens_reset = _reset_ms(self.tokens)
        if (
            requests_left == self.said_requests_left
            and tokens_left == self.said_tokens_left
            and requests_reset == self.said_requests_reset
            and tokens_reset == self.said_tokens_reset
        ):
            return self.said_lines
        self.said_lines = ratelimit_lines(
            self.requests_prefix,
            requests_left,
            requests_reset,
            self.tokens_prefix,
            tokens_left,
            tokens_reset,
        )
        self.said_requests_left, self.said_requests_reset = requests_left, requests_reset
        self.said_tokens_left, self.said_tokens_reset = tokens_left, tokens_reset
        return self.said_lines

    def _forget_lines(self) -> None:
        """The next limit_headers() writes its lines anew (their prefixes changed)."""
        self.said_lines = b""
        self.said_requests_left = self.said_requests_reset = -1
        self.said_tokens_left = self.said_tokens_reset = -1

    def report(self) -> dict:
        wanted, self.wanted_in_flight = self.wanted_in_flight, self.in_flight + self.waiting
        return {
            "demand": [self.demand_requests, self.demand_tokens, wanted],
            "in_flight": self.in_flight,
            "usage": {model: row.as_list() for model, row in self.usage.items()},
        }


def _header_prefix(kind: bytes, limit: float) -> bytes:
    """The limit's line and the start of the remaining's; empty where there is no limit."""
    if not limit:
        return b""
    return b"x-ratelimit-limit-%s: %d\r\nx-ratelimit-remaining-%s: " % (kind, int(limit), kind)


def _left(bucket: Bucket) -> int:
    return int(bucket.level) if bucket.level > 0 else 0


def _reset_ms(bucket: Bucket) -> int:
    """Until the bucket is full again."""
    if bucket.level >= bucket.per_minute or bucket.per_minute <= 0:
        return 0
    return int((bucket.per_minute - bucket.level) * 60000.0 / bucket.per_minute)


class TenantBook:
    """Every tenant this router knows, and the digests of their keys."""

    def __init__(self) -> None:
        self.by_digest: dict = {}  # SHA-256 of a key -> (TenantState, key id)
        self.tenants: dict = {}  # name -> TenantState
        self.keys_used: set = set()  # ids of the keys used since the last report
        self.share_lease_s = 15.0
        self.lease_until = 0.0  # monotonic: the shares hold until then
        self.file_keys: dict = {}  # --api-keys-file's digests -> (tenant, "")
        # Authorization headers already found -> (tenant, key id), until the next table: a
        # client's next request costs a lookup, not a hash. Only keys that exist are kept.
        self.known: dict = {}
        self.last_authorization = None  # the last header found, its tenant and key id
        self.last_found = None
        self.last_marked = False  # its key is in keys_used
        self.required = False  # the control plane says every request needs a tenant's key
        # With a tenants file and several workers: their shared count of requests in flight
        # (router/tenancy/inflight.py), which holds each max_in_flight for them all at once.
        self.shared_in_flight = None

    def enabled(self) -> bool:
        """Whether a request needs a key: when the control plane says so (once any tenant
        was applied, even if none is left: fail closed), while any tenant is known, or when
        --api-keys-file was given."""
        return self.required or bool(self.tenants)

    def find(self, authorization: bytes | None) -> TenantState:
        """The tenant of a request's `Authorization: Bearer KEY`, or None."""
        if authorization is not None and authorization == self.last_authorization:
            # The key of the request before (a client's connections share one): no hash.
            found = self.last_found
            if not self.last_marked:
                self.last_marked = True
                if found[1]:
                    self.keys_used.add(found[1])
            return found[0]
        found = self.known.get(authorization)
        if found is None:
            if authorization is None or len(authorization) > MAX_AUTHORIZATION:
                return None
            if not authorization.startswith(b"Bearer "):
                return None
            found = self.by_digest.get(hashlib.sha256(authorization[7:].strip()).digest())
            if found is None:
                return None
            if len(self.known) < MAX_KNOWN:
                self.known[authorization] = found
        if found[1]:
            self.keys_used.add(found[1])
        self.last_authorization, self.last_found, self.last_marked = authorization, found, True
        return found[0]

    def forget_last(self) -> None:
        self.last_authorization = None
        self.last_found = None

    def use_keys_file(self, keys, now: float) -> None:
        tenant = TenantState(KEYS_FILE_TENANT, now)
        tenant.configure({}, None, 0.0, 1)
        self.file_keys = {hashlib.sha256(key).digest(): (tenant, "") for key in keys}
        self.tenants[KEYS_FILE_TENANT] = tenant
        self.by_digest = {**self.by_digest, **self.file_keys}
        self.known = {}
        self.forget_last()

    def heard(self, now: float) -> None:
        """The control plane answered: the shares it gave hold for another lease."""
        self.lease_until = now + self.share_lease_s

    def update(self, part: dict, router_id: str, now: float) -> None:
        """Apply a routing table's `tenants` part. A tenant kept keeps its buckets and
        counters; requests of a tenant gone finish with the state they hold."""
        rules = part.get("tenants") or {}
        self.required = part.get("auth") == "tenants"
        self.share_lease_s = float(part.get("share_lease_s") or self.share_lease_s)
        floor_share = float(part.get("floor_share") or 0.02)
        routers = int(part.get("routers") or 0)
        reserved_share = float(part.get("reserved_share") or 0.0)
        tenants = {}
        for name, body in rules.items():
            tenant = self.tenants.get(name) or TenantState(name, now)
            shares = body.get("shares") or {}
            tenant.configure(
                body, shares.get(router_id), floor_share, len(shares) or 1, routers, reserved_share
            )
            if self.shared_in_flight is not None and tenant.shared_cell < 0:
                tenant.shared = self.shared_in_flight
                tenant.shared_cell = self.shared_in_flight.cell(name)
            tenants[name] = tenant
        if self.file_keys:
            tenants[KEYS_FILE_TENANT] = self.tenants[KEYS_FILE_TENANT]
        by_digest = dict(self.file_keys)
        for hex_digest, (name, key_id) in (part.get("keys") or {}).items():
            tenant = tenants.get(name)
            if tenant is not None:
                by_digest[bytes.fromhex(hex_digest)] = (tenant, key_id)
        self.tenants = tenants
        self.by_digest = by_digest
        self.known = {}
        self.forget_last()
        self.heard(now)

    def report(self) -> dict:
        return {name: tenant.report() for name, tenant in self.tenants.items()}

    def take_keys_used(self) -> dict:
        """{key id: now} for the keys used since the last call (last use, to a report's
        period: a wall clock read per request would cost more than the key's hash)."""
        now = time.time()
        used, self.keys_used = self.keys_used, set()
        self.last_marked = False
        return dict.fromkeys(used, now)

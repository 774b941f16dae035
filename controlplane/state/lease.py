"""Who leads: one lease row in PostgreSQL (holder, epoch, expiry on the database's clock).

A server campaigns by taking the row once it has expired, which moves the epoch one up; it
holds it by renewing every `renew_s` for `ttl_s`. It stops acting the moment its own deadline
passes (the time it sent the last renewal that succeeded, plus the TTL less a margin): the
database can only have given the row away later than that, so a leader never acts while
another does, as long as the two hosts' clocks run at the same rate. Writes do not rely on
that: each is fenced by the epoch (controlplane/state/pgstore.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg

log = logging.getLogger("gpufleet.lease")

# FOR UPDATE first: it waits for the old leader's write in flight (FOR KEY SHARE) to end, so
# that write is fenced; a plain UPDATE would not wait for it.
LOCK = "SELECT 1 FROM leader_lease WHERE id = 1 FOR UPDATE"
TAKE = """UPDATE leader_lease
    SET holder = $1, url = $2, epoch = epoch + 1, won_at = now(),
        expires_at = now() + $3 * interval '1 second'
    WHERE id = 1 AND expires_at <= now()
    RETURNING epoch, extract(epoch from now())::float8"""
RENEW = """UPDATE leader_lease SET expires_at = now() + $3 * interval '1 second'
    WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > now()
    RETURNING epoch"""
RELEASE = """UPDATE leader_lease SET expires_at = now()
    WHERE id = 1 AND holder = $1 AND epoch = $2"""
WHO = "SELECT url, epoch, expires_at > now() FROM leader_lease WHERE id = 1"
DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


class Lease:
    def __init__(
        self,
        pool: asyncpg.Pool,
        holder: str,
        url: str,
        ttl_s: float = 5.0,
        renew_s: float = 1.0,
        clock=time.monotonic,
        wall=time.time,
    ) -> None:
        if not 0 < renew_s < ttl_s:
            raise ValueError("the lease must be renewed more often than it expires")
        self.pool, self.holder, self.url = pool, holder, url
        self.ttl_s, self.renew_s = ttl_s, renew_s
        self.margin_s = min(0.5, ttl_s / 4)
        self.clock, self.wall = clock, wall
        # The database's clock less this host's, learnt as the lease is won: what a leader
        # stores is on the database's clock, so that two hosts' clocks are never compared.
        self.clock_offset_s = 0.0
        self.epoch: int | None = None  # while this server leads
        self.deadline = float("-inf")
        self.leader_url: str | None = None  # whoever leads, as last read
        self.lost = asyncio.Event()

    @property
    def held(self) -> bool:
        return self.epoch is not None and self.clock() < self.deadline

    async def campaign(self) -> int:
        """Wait until this server leads; returns its epoch."""
        while True:
            sent, sent_wall = self.clock(), self.wall()
            try:
                async with (
                    self.pool.acquire(timeout=self.renew_s) as conn,
                    conn.transaction(),
                ):
                    await conn.execute(LOCK)
                    won = await conn.fetchrow(TAKE, self.holder, self.url, self.ttl_s)
                    epoch = won[0] if won else None
                    if epoch is not None:
                        # now() is the transaction's start: between the send and the answer
                        self.clock_offset_s = won[1] - (sent_wall + self.wall()) / 2
                    else:
                        url, _, live = await conn.fetchrow(WHO)
                        self.leader_url = url if live and url else None
            except DB_ERRORS as exc:
                log.warning("cannot reach the database to campaign: %s", exc)
                self.leader_url = None
                epoch = None
            if epoch is not None:
                self.epoch, self.deadline = epoch, sent + self.ttl_s - self.margin_s
                self.leader_url = self.url
                self.lost.clear()
                log.info("leading at epoch %d", epoch)
                return epoch
            await asyncio.sleep(self.renew_s)

    async def hold(self) -> None:
        """Renew until the lease is lost or the deadline passes; returns then, having stopped
        leading (`held` is False from the deadline on, whatever this task is doing)."""
        try:
            while self.held:
                await asyncio.sleep(self.renew_s)
                sent = self.clock()
                left = self.deadline - sent
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(left):
                        async with self.pool.acquire() as conn:
                            renewed = await conn.fetchval(
                                RENEW, self.holder, self.epoch, self.ttl_s
                            )
                except DB_ERRORS as exc:
                    log.warning("cannot renew the lease: %s", exc)
                    continue  # try again while the deadline allows
                if renewed is None:
                    log.warning("the lease of epoch %d was taken over", self.epoch)
                    break
                self.deadline = sent + self.ttl_s - self.margin_s
        finally:
            self.step_down()

    def step_down(self) -> None:
        if self.epoch is not None:
            log.warning("no longer leading (epoch %d)", self.epoch)
        self.epoch = None
        self.leader_url = None
        self.lost.set()

    async def release(self, epoch: int) -> None:
        """A clean stop: the row expires now, so a standby takes over at its next try."""
        try:
            async with asyncio.timeout(self.renew_s):
                async with self.pool.acquire() as conn:
                    await conn.execute(RELEASE, self.holder, epoch)
        except DB_ERRORS as exc:
            log.warning("could not release the lease: %s", exc)

"""The node agent's loop: register, then heartbeat (GPU health and replica states), receive
assignments, and have the supervisor start and stop processes to match."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from pathlib import Path
from typing import Protocol

import aiohttp

from controlplane.agent.supervisor import Supervisor
from controlplane.vocabulary.auth import digest, new_credential

WATCH_S = 60.0  # how long a watch of this node's orders waits for news before it asks again

log = logging.getLogger("gpufleet.agent")
WATCH_MARGIN_S = 5.0  # past its wait, an unanswered watch is given up and asked again


class Inventory(Protocol):
    name: str

    def describe(self) -> dict: ...
    def health(self) -> list[dict]: ...
    def replica_memory(self, running: dict) -> dict[str, int]: ...
    def refuse_over(self, running: dict, stopping: dict) -> list[tuple[str, str]]: ...


class ControlPlaneError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ServerMoved(Exception):
    """A watch given up because the client moved to another server meanwhile (its server
    failed a heartbeat, or sent it to the leader): watch again there, at once."""


class ControlPlaneClient:
    """Posts to the control plane. `servers`: one URL or a comma-separated list of servers on
    one database; the agent sticks to the one that answers, moves to where a standby's 307
    sends it, and tries the next after a failure: a failover costs it one heartbeat."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        servers: str,
        token: str | None,
        ssl=None,
        watch_session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.session = session
        # The watches' own pool: thousands of simulated nodes' parked watches must not hold
        # every connection the heartbeats need.
        self.watch_session = watch_session or session
        self.servers = [url.strip().rstrip("/") for url in servers.split(",") if url.strip()]
        self.current = 0
        self.moved = asyncio.Event()  # set, and replaced, each time `current` changes
        self.token = token  # the agent (bootstrap) token
        self.ssl = ssl  # an SSLContext that trusts the control plane's CA, or None

    @property
    def base_url(self) -> str:
        return self.servers[self.current]

    async def post(self, path: str, body: dict, token: str | None = None) -> dict:
        return await self.request("POST", path, token, json=body)

    async def watch(self, path: str, token: str | None, timeout_s: float, **params) -> dict:
        """A long poll, given up (ServerMoved) as soon as the client moves to another server:
        a watch parked on a frozen leader must not outlast the heartbeat that found it out,
        as a router's route watch is bounded by the lease."""
        moved = self.moved
        polling = asyncio.ensure_future(
            self.request("GET", path, token, timeout_s, self.watch_session, params=params)
        )
        moving = asyncio.ensure_future(moved.wait())
        try:
            await asyncio.wait({polling, moving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            moving.cancel()
        if polling.done():
            return polling.result()
        polling.cancel()
        raise ServerMoved(self.base_url)

    async def request(
        self,
        method: str,
        path: str,
        token: str | None,
        timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
        **kwargs,
    ) -> dict:
        token = token or self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        server = self.base_url
        try:
            async with (session or self.session).request(
                method,
                server + path,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                ssl=self.ssl if self.ssl is not None else True,
                **kwargs,
            ) as resp:
                answer = await resp.json(content_type=None)
                if resp.history:
                    self._lead_at(resp.url)
        except (aiohttp.ClientError, OSError, TimeoutError):
            self._failed(server)
            raise
        if resp.status >= 300:
            if resp.status == 503:  # a standby in an election, or a leader that lost its store
                self._failed(server)
            message = answer.get("error", {}).get("message") if isinstance(answer, dict) else answer
            raise ControlPlaneError(resp.status, str(message))
        return answer

    def _failed(self, server: str) -> None:
        """Move on from `server`, once: the thousand heartbeats that failed on it together
        must not walk the list back to it."""
        if self.servers[self.current] == server:
            self._move_to((self.current + 1) % len(self.servers))

    def _lead_at(self, url) -> None:
        leader = str(url.origin())
        if leader not in self.servers:
            self.servers.append(leader)
        self._move_to(self.servers.index(leader))

    def _move_to(self, index: int) -> None:
        if index != self.current:
            self.current = index
            self.moved.set()
            self.moved = asyncio.Event()


class Credential:
    """The node's own credential, kept in its state directory (readable by this user alone):
    heartbeats and assignments for the node need it. The agent makes it itself and keeps it
    before it registers, sending only its SHA-256: a registration whose answer is lost (a
    timeout under load) leaves the agent with a credential the control plane knows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending = path.with_name(path.name + ".pending")  # made, not yet accepted

    def read(self) -> str | None:
        return self._read(self.path)

    def proposed(self) -> str:
        """The credential this node offers at registration, made once."""
        token = self._read(self.pending)
        if token is None:
            token = new_credential()[0]
            self._write(self.pending, token)
        return token

    def accepted(self) -> None:
        self.pending.replace(self.path)

    def write(self, token: str) -> None:
        self._write(self.path, token)

    @staticmethod
    def _read(path: Path) -> str | None:
        try:
            return path.read_text().strip() or None
        except FileNotFoundError:
            return None

    @staticmethod
    def _write(path: Path, token: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")


def older(version: str, than: str) -> bool:
    """Whether orders `version` (MARK.COUNTER, controlplane/state/orders.py) are older than `than`:
    only within one leader's term (one MARK) can they be; another term's are news."""
    mark, _, counter = version.rpartition(".")
    held_mark, _, held_counter = than.rpartition(".")
    try:
        return mark == held_mark and int(counter) < int(held_counter)
    except ValueError:
        return False


class NodeAgent:
    def __init__(
        self,
        inventory: Inventory,
        supervisor: Supervisor,
        client: ControlPlaneClient,
        heartbeat_s: float = 2.0,
        credential: Credential | None = None,
        watch_s: float = WATCH_S,
    ) -> None:
        self.inventory = inventory
        self.supervisor = supervisor
        self.client = client
        self.heartbeat_s = heartbeat_s
        self.credential = credential
        self.watch_s = watch_s  # how long one watch of the orders waits; 0: no watch
        self.silenced = False  # fault injection: the node stops heartbeating
        self.orders: str | None = None  # the version of the orders applied last
        self.digest: str | None = None  # and the digest of their assignments
        self.heard = asyncio.Event()  # set once a first answer gave the orders
        self.beating = asyncio.Event()  # set once registered and a heartbeat was answered
        self.trouble = ""  # why not, while not: the last registration or heartbeat failure

    async def run(self) -> None:
        await self.register()
        watch = asyncio.create_task(self.watch_orders()) if self.watch_s > 0 else None
        try:
            while True:
                try:
                    await self.beat()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the control plane may be away: keep replicas as is
                    log.warning("%s: heartbeat failed: %s", self.inventory.name, exc)
                    self.trouble = f"heartbeat failed: {exc}"
                await self._until_next_beat()
        finally:
            if watch is not None:
                watch.cancel()

    def take_orders(self, answer: dict) -> bool:
        """Run what an answer assigns, unless an answer applied already is newer: a heartbeat's
        answer and a watch's may cross on the way. Returns whether it was applied."""
        version = answer.get("orders")
        if isinstance(version, str) and self.orders is not None and older(version, self.orders):
            return False
        self.orders = version if isinstance(version, str) else None
        self.digest = answer.get("digest")
        self.heard.set()
        self.supervisor.reconcile(answer["assignments"])
        return True

    async def watch_orders(self) -> None:
        """Hear new orders as soon as a tick decides them: a long poll of this node's
        assignments, answered when they differ from what this agent holds. Carried out and
        reported at once, by the next heartbeat brought forward."""
        pause = self.heartbeat_s
        while True:
            await self.heard.wait()  # a heartbeat's answer gave the orders to watch from
            if self.silenced:
                await asyncio.sleep(self.heartbeat_s)
                continue
            wait = self.watch_s * random.uniform(0.8, 1.0)  # parked watches end apart
            held = self.digest
            try:
                answer = await self.client.watch(
                    f"/v1/nodes/{self.inventory.name}/assignments",
                    self.own_token(),
                    wait + WATCH_MARGIN_S,
                    digest=held,
                    wait=f"{wait:.1f}",
                )
            except asyncio.CancelledError:
                raise
            except ServerMoved:
                continue  # watch the server the client moved to, at once
            except Exception as exc:  # heartbeats carry the orders meanwhile
                log.debug("%s: orders watch failed: %s", self.inventory.name, exc)
                await asyncio.sleep(pause)
                continue
            if "digest" not in answer:  # a control plane without watches: heartbeats only
                log.info("%s: the control plane answers no watch of orders", self.inventory.name)
                return
            if answer["digest"] != held and not self.silenced and self.take_orders(answer):
                self.supervisor.news.set()  # carry them out and report now

    async def _until_next_beat(self) -> None:
        """One heartbeat period, or less when an engine finished falling asleep or waking: a
        swap waits on that news, not on the next period."""
        # Jittered: nodes that registered together must not beat together for ever. Under
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns as if not cancelled
        # when the stop's cancel meets news that came in the same turn, and the loop beats on.
        period = self.heartbeat_s * random.uniform(0.9, 1.1)
        try:
            async with asyncio.timeout(period):
                await self.supervisor.news.wait()
        except TimeoutError:
            pass
        self.supervisor.news.clear()

    async def register(self) -> None:
        delay = 0.2
        while True:
            try:
                if self.own_token() or self.credential is None or not self.client.token:
                    answer = await self.client.post(
                        "/v1/nodes", self.inventory.describe(), token=self.own_token()
                    )
                    if answer.get("credential") and self.credential is not None:
                        self.credential.write(answer["credential"])  # an older control plane
                else:
                    await self.register_with_own_credential()
                log.info("%s registered", self.inventory.name)
                return
            except asyncio.CancelledError:
                raise
            except ControlPlaneError as exc:
                if exc.status == 401 and self.own_token():
                    # Revoked (the node was deleted) or unknown to this control plane: never
                    # fall back to the bootstrap token on our own, that would undo a revocation.
                    log.error(
                        "%s: the control plane refuses this node's credential (%s): an"
                        " operator deleted the node, or this is another control plane's"
                        " state; remove %s to register anew",
                        self.inventory.name,
                        exc,
                        self.credential.path,
                    )
                else:
                    log.warning("%s: registration failed (%s); retrying", self.inventory.name, exc)
                self.trouble = f"registration failed: {exc}"
            except Exception as exc:
                log.warning("%s: registration failed (%s); retrying", self.inventory.name, exc)
                self.trouble = f"registration failed: {exc!r}"
            # Refused or unreachable alike, the next try waits: thousands of agents retrying
            # at once must not keep a struggling control plane down.
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def register_with_own_credential(self) -> None:
        """First registration: the bootstrap token and the SHA-256 of a credential made here.
        If an earlier try went through and only its answer was lost, the node is registered
        with that credential already: it registers again as itself."""
        proposed = self.credential.proposed()
        body = {**self.inventory.describe(), "credential_sha256": digest(proposed)}
        try:
            await self.client.post("/v1/nodes", body)
        except ControlPlaneError as exc:
            if exc.status != 403:
                raise
            await self.client.post("/v1/nodes", self.inventory.describe(), token=proposed)
        self.credential.accepted()

    def own_token(self) -> str | None:
        return self.credential.read() if self.credential is not None else None

    async def beat(self) -> None:
        await self.supervisor.check(self.client.session)
        for replica, why in self.inventory.refuse_over(
            self.supervisor.running, self.supervisor.stopping
        ):
            log.error("%s: %s", replica, why)
            self.supervisor.refuse(replica, why)
        if self.silenced:
            return
        reports = self.supervisor.reports()
        for replica, mb in self.inventory.replica_memory(self.supervisor.running).items():
            if replica in reports:
                reports[replica]["gpu_memory_mb"] = mb
        body = {"gpus": self.inventory.health(), "replicas": reports}
        try:
            answer = await self.client.post(
                f"/v1/nodes/{self.inventory.name}/heartbeat", body, token=self.own_token()
            )
        except ControlPlaneError as exc:
            if exc.status in (401, 404):  # the control plane lost us, or revoked us
                await self.register()
                return
            raise
        self.take_orders(answer)
        self.beating.set()
        paced = answer.get("heartbeat_s")
        if isinstance(paced, int | float) and 0 < paced < math.inf:
            self.heartbeat_s = float(paced)  # the control plane paces a large fleet's beats

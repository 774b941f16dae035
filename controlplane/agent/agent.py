"""The node agent's loop: register, then heartbeat (GPU health and replica states), receive
assignments, and have the supervisor start and stop processes to match."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import aiohttp

from controlplane.agent.supervisor import Supervisor

log = logging.getLogger("gpufleet.agent")


class Inventory(Protocol):
    name: str

    def describe(self) -> dict: ...
    def health(self) -> list[dict]: ...


class ControlPlaneError(Exception):
    pass


class ControlPlaneClient:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str | None) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def post(self, path: str, body: dict) -> dict:
        async with self.session.post(
            self.base_url + path,
            json=body,
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=10),
        ) as resp:
            answer = await resp.json(content_type=None)
            if resp.status >= 300:
                message = (
                    answer.get("error", {}).get("message") if isinstance(answer, dict) else answer
                )
                raise ControlPlaneError(f"HTTP {resp.status}: {message}")
            return answer


class NodeAgent:
    def __init__(
        self,
        inventory: Inventory,
        supervisor: Supervisor,
        client: ControlPlaneClient,
        heartbeat_s: float = 2.0,
    ) -> None:
        self.inventory = inventory
        self.supervisor = supervisor
        self.client = client
        self.heartbeat_s = heartbeat_s
        self.silenced = False  # fault injection: the node stops heartbeating

    async def run(self) -> None:
        await self.register()
        while True:
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control plane may be away: keep replicas as they are
                log.warning("%s: heartbeat failed: %s", self.inventory.name, exc)
            await asyncio.sleep(self.heartbeat_s)

    async def register(self) -> None:
        delay = 0.2
        while True:
            try:
                await self.client.post("/v1/nodes", self.inventory.describe())
                log.info("%s registered", self.inventory.name)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s: registration failed (%s); retrying", self.inventory.name, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def beat(self) -> None:
        await self.supervisor.check(self.client.session)
        if self.silenced:
            return
        body = {"gpus": self.inventory.health(), "replicas": self.supervisor.reports()}
        try:
            answer = await self.client.post(f"/v1/nodes/{self.inventory.name}/heartbeat", body)
        except ControlPlaneError as exc:
            if "HTTP 404" in str(exc):  # the control plane lost us (a new state file)
                await self.register()
                return
            raise
        self.supervisor.reconcile(answer["assignments"])

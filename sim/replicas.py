"""Replicas of a simulated fleet without a process each: `replicas: in_process` in a fleet file.

A process per replica is what makes the simulation honest about starting, crashing and being
stopped, and what limits it: 10,000 `sim-engine` processes do not fit on one machine. Here the
agent answers for each replica itself, with the same reports a supervised process gives
(Starting, then Ready once the command's `--startup-delay` has passed; Failed when killed;
Stopping, then gone), and one HTTP server in the agent serves every replica's engine at
`/replicas/ID/...`, each with its own state (faults, prefix cache, stored responses). Only
`gpuctl sim-engine` commands can run this way: a replica of any other command fails and says so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from controlplane.agent.processes import expand
from controlplane.agent.supervisor import Reconciles, adapters_to_unload
from sim.engine import MAX_BODY, AdapterRefused, EngineSettings, SimEngine, errors_as_json

log = logging.getLogger("gpufleet.agent")
PREFIX = "/replicas/{replica}"


class EngineHost:
    """One HTTP server for the engines of every in-process replica of this agent."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.engines: dict[str, SimEngine] = {}
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[errors_as_json])
        for method, path, handler in SimEngine.ROUTES:
            app.router.add_route(method, PREFIX + path, self._dispatch(handler))
        return app

    def _dispatch(self, handler: str):
        async def serve(request: web.Request) -> web.StreamResponse:
            engine = self.engines.get(request.match_info["replica"])
            if engine is None:
                # What a client of a stopped engine sees, as near as one server can say it.
                return web.json_response(
                    {"error": {"message": "no such replica here", "type": "not_found"}}, status=404
                )
            return await getattr(engine, handler)(request)

        return serve

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        # Bound here, not by port number: a port looked up as free may be taken by the time
        # a server binds it.
        sock = socket.socket()
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        log.info("in-process replicas served on http://%s:%d/replicas/", self.host, self.port)

    async def close(self) -> None:
        self.engines.clear()
        if self._runner is not None:
            await self._runner.cleanup()

    def url_of(self, address: str, replica: str) -> str:
        return f"http://{address}:{self.port}/replicas/{replica}"


@dataclass
class InProcess:
    """What the agent knows of one in-process replica (the fields reports() needs)."""

    replica: str
    model: str
    rank: int
    started_at: float
    engine: SimEngine | None
    state: str = "Starting"
    reason: str = ""
    exit_code: int | None = None
    sleep: int = 0  # the level the control plane wants it asleep at (0: awake)
    engine_kind: str | None = None
    engine_endpoints: dict | None = None
    adapters_wanted: dict | None = None
    adapter_failures: dict | None = None
    memory_share: float = 0.9  # the share of each card it was told it may take awake
    adapter_resolver: bool = False
    ever_assigned: list = field(default_factory=list)  # kept in the replica's record
    gpus: list = field(default_factory=list)  # the indexes of its node's cards it runs on


class InProcessSupervisor(Reconciles):
    """A Supervisor's part for one simulated node whose replicas run in the agent itself."""

    def __init__(
        self,
        host: EngineHost,
        address: str,
        settings_of: Callable[[list[str]], EngineSettings],
    ) -> None:
        """`settings_of`: the engine's settings from a `gpuctl sim-engine` argument list
        (raises ValueError, saying why, for one it does not accept)."""
        self.host = host
        self.address = address
        self.settings_of = settings_of
        self.running: dict[str, InProcess] = {}
        self.stopping: dict[str, InProcess] = {}
        self.failed: dict[str, InProcess] = {}
        # Never set: its engines change state within `check`, before the heartbeat reads them.
        self.news = asyncio.Event()

    def start(self, a: dict) -> None:
        record = InProcess(a["replica"], a["model"], a["rank"], time.time(), None)
        record.memory_share = float(a.get("gpu_memory_utilization") or 0.9)
        record.gpus = list(a.get("gpus") or [])
        argv = expand(a["command"], {"port": "0", "model": a["model"], "host": "127.0.0.1"})
        try:
            settings = self.settings_of(sim_engine_args(argv))
        except ValueError as exc:
            record.state, record.reason = "Failed", f"cannot run in process: {exc}"
            self.failed[record.replica] = record
            return
        if record.rank == 0:
            record.engine = SimEngine(settings)
            self.host.engines[record.replica] = record.engine
        self.running[record.replica] = record

    def stop(self, replica: str) -> None:
        record = self.running.pop(replica, None)
        if record is not None:
            self.host.engines.pop(replica, None)
            self.stopping[replica] = record

    def kill(self, replica: str) -> bool:
        """Fault injection: the replica dies now, as a killed process would."""
        record = self.running.pop(replica, None)
        if record is None:
            return False
        self.host.engines.pop(replica, None)
        record.state, record.exit_code = "Failed", -9
        record.reason = "the engine exited with code -9"
        self.failed[replica] = record
        return True

    def refuse(self, replica: str, why: str) -> None:
        """Its card refused the engine memory: it dies as on CUDA's out-of-memory error."""
        if self.kill(replica):
            self.failed[replica].reason = why

    async def check(self, session=None) -> None:
        # A stopped engine is gone once its Stopping has been reported, as an exited process.
        reported = [r for r in self.stopping.values() if r.state == "Stopping"]
        for record in reported:
            del self.stopping[record.replica]
        for record in self.stopping.values():
            record.state = "Stopping"
        for record in self.running.values():
            engine = record.engine
            if engine is None:
                record.state = "Ready"  # followers serve through the leader's endpoint
            elif engine.loading():
                record.state = "Starting"
            elif record.sleep or engine.sleep_level or not engine.awake():
                record.state, record.reason = self._sleep_or_wake(record, engine), ""
            elif engine.settings.faults.unhealthy:
                record.state, record.reason = "Unhealthy", "/health is failing"
            else:
                record.state, record.reason = "Ready", ""
                self._sync_adapters(record, engine)

    @staticmethod
    def _sync_adapters(record: InProcess, engine: SimEngine) -> None:
        """What the agent's calls to /v1/(un)load_lora_adapter would do, done in place."""
        wanted = record.adapters_wanted or {}
        failures = record.adapter_failures or {}
        for name in adapters_to_unload(record, list(engine.settings.adapters)):
            if name not in engine.static_adapters:
                engine.settings.adapters.remove(name)
                record.ever_assigned = [a for a in record.ever_assigned if a != name]
        for name, source in wanted.items():
            if name in engine.settings.adapters or name in failures:
                continue
            try:
                engine.check_adapter(name, source)
            except AdapterRefused as exc:
                record.adapter_failures = {**failures, name: f"HTTP {exc.status}: {exc}"}
                continue
            engine.settings.adapters.append(name)

    @staticmethod
    def _sleep_or_wake(record: InProcess, engine: SimEngine) -> str:
        """The engine's state as it sleeps or wakes the way the control plane wants (sim
        engines take vLLM's orders; an engine of another kind is never told to sleep)."""
        if record.sleep and not engine.sleep_level:
            engine.begin_sleep(record.sleep)
        elif not record.sleep and engine.sleep_level:
            engine.begin_wake()
        if engine.asleep():
            return "Asleep"
        if record.sleep:
            return "Ready"  # still falling asleep: as its agent knows, it serves
        return "Ready" if engine.awake() else "Waking"

    def reports(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for replica, record in self.running.items():
            url = self.host.url_of(self.address, replica) if record.rank == 0 else ""
            engine = record.engine
            held = (
                [a for a in engine.settings.adapters if a not in engine.static_adapters]
                if engine is not None
                else []
            )
            out[replica] = {
                "state": record.state,
                "reason": record.reason,
                "url": url,
                "adapters": held,
                "adapter_failures": dict(record.adapter_failures or {}),
            }
        for replica, record in self.failed.items():
            out[replica] = {
                "state": "Failed",
                "reason": record.reason,
                "exit_code": record.exit_code,
                "log_tail": "",
            }
        for replica in self.stopping:
            out[replica] = {"state": "Stopping"}
        return out

    def stop_all(self, wait_s: float | None = None) -> None:
        for replica in list(self.running):
            self.host.engines.pop(replica, None)
        self.running.clear()
        self.stopping.clear()


def sim_engine_args(argv: list[str]) -> list[str]:
    """The arguments of a `gpuctl sim-engine` command, or ValueError for another command."""
    if len(argv) >= 2 and os.path.basename(argv[0]) == "gpuctl" and argv[1] == "sim-engine":
        return argv[2:]
    raise ValueError(f"only `gpuctl sim-engine` runs without a process, not {' '.join(argv[:2])}")


class InProcessReplicas:
    """An agent's in-process replicas: the one engine server, and a supervisor per node."""

    def __init__(self, settings_of: Callable[[list[str]], EngineSettings], host: str) -> None:
        self.settings_of = settings_of
        self.host = EngineHost(host)

    async def start(self) -> None:
        await self.host.start()

    def supervisor(self, address: str) -> InProcessSupervisor:
        return InProcessSupervisor(self.host, address, self.settings_of)

    async def close(self) -> None:
        await self.host.close()

"""Runs a node's replica processes: start from the spec's argv, probe, report, stop, adopt.

Processes are started without a shell, in their own session (so that a stop reaches the
engine's workers too), with CUDA_VISIBLE_DEVICES and rank variables. Each one is recorded in
the state directory, so that an agent that restarts finds the processes it started before and
adopts them, or stops them if they are no longer assigned: no orphan keeps holding GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from controlplane.agent.engineenv import engine_environment
from controlplane.agent.engines import (
    control_of,
    load_adapter,
    order,
    sleeping,
    unload_adapter,
)
from controlplane.agent.envfrom import EnvFromError
from controlplane.agent.envfrom import resolve as resolve_env_from
from controlplane.agent.processes import (
    EnginePorts,
    cmdline,
    expand,
    process_alive,
    resolve,
    same_program,
)

log = logging.getLogger("gpufleet.agent")
UNHEALTHY_AFTER = 3  # failed probes in a row before a Ready replica is Unhealthy


@dataclass
class Running:
    replica: str
    model: str
    pid: int
    port: int
    argv: list[str]
    gpus: list[int]
    rank: int
    health_path: str
    started_at: float
    state: str = "Starting"  # Starting, Ready, Unhealthy, Failed; Asleep, Waking
    reason: str = ""
    exit_code: int | None = None
    failed_probes: int = 0
    stopping_since: float = 0.0
    sleep: int = 0  # the level the control plane wants it asleep at (0: awake)
    engine_kind: str | None = None
    engine_endpoints: dict | None = None
    adapters_wanted: dict | None = None  # adapter -> source, as the assignment says
    adapters: list | None = None  # what the engine holds
    adapter_failures: dict | None = None  # adapter -> why its load failed
    memory_share: float = 0.9  # the share of each card it was told it may take awake
    # Its engine loads adapters itself on a first request (`adapter_resolver`): what it holds
    # is read from its /v1/models, and only adapters it was once told to hold are unloaded.
    adapter_resolver: bool = False
    ever_assigned: list = field(default_factory=list)  # kept in the replica's record
    refused: str = ""  # why its card refused it memory (it was ended for that)


def adapters_to_unload(run, held: list[str]) -> list[str]:
    """What the engine holds and is not assigned. An engine that loads adapters itself may
    hold one the control plane has not taken on yet (it will, from the next report): only
    those it was once assigned, and is no longer, are unloaded."""
    wanted = run.adapters_wanted or {}
    return [
        a for a in held if a not in wanted and (not run.adapter_resolver or a in run.ever_assigned)
    ]


class Reconciles:
    """What every supervisor does with its node's assignments, however it runs replicas: it
    keeps `running`, `stopping` and `failed` by replica id, and can `start` and `stop` one;
    `news` is set when an engine changed state between heartbeats."""

    running: dict
    stopping: dict
    failed: dict
    news: asyncio.Event

    def reconcile(self, assignments: list[dict]) -> None:
        """Start what is assigned and not running; stop what runs and is not assigned; note
        which engines should sleep (the next `check` tells them)."""
        wanted = {a["replica"]: a for a in assignments}
        for replica, run in list(self.running.items()):
            if replica not in wanted:
                self.stop(replica)
                continue
            assignment = wanted[replica]
            run.sleep = int(assignment.get("sleep") or 0)
            run.engine_kind = assignment.get("engine")
            run.engine_endpoints = assignment.get("engine_endpoints") or {}
            run.adapters_wanted = {a["name"]: a["source"] for a in assignment.get("adapters", [])}
            run.adapter_resolver = bool(assignment.get("adapter_resolver"))
            run.ever_assigned = sorted(set(run.ever_assigned) | set(run.adapters_wanted))
            failures = run.adapter_failures or {}
            run.adapter_failures = {k: v for k, v in failures.items() if k in run.adapters_wanted}
        for replica, assignment in wanted.items():
            if (
                replica not in self.running
                and replica not in self.failed
                and replica not in self.stopping
            ):
                self.start(assignment)
        for replica in list(self.failed):
            if replica not in wanted:
                del self.failed[replica]


class Supervisor(Reconciles):
    def __init__(
        self,
        state_dir: Path,
        address: str,
        stop_grace_s: float = 30.0,
        start_timeout_s: float = 1800.0,
        ports: EnginePorts | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.records = state_dir / "replicas"
        self.logs = state_dir / "logs"
        self.records.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.address = address
        self.stop_grace_s = stop_grace_s
        self.start_timeout_s = start_timeout_s
        self.running: dict[str, Running] = {}
        self.children: dict[int, subprocess.Popen] = {}
        self.stopping: dict[str, Running] = {}
        self.failed: dict[str, Running] = {}
        self.ports = ports or EnginePorts()
        self.ports.join(self)
        self.orders: dict[str, asyncio.Task] = {}  # replica -> its sleep or wake call
        self.news = asyncio.Event()  # set when an engine is asleep or awake again
        self.adopt()

    # records

    def _record_path(self, replica: str) -> Path:
        return self.records / f"{replica}.json"

    def _save(self, run: Running) -> None:
        path = self._record_path(run.replica)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(run)))
        os.replace(tmp, path)

    def adopt(self) -> None:
        """Take over the processes a previous agent started; forget the dead ones."""
        for path in self.records.glob("*.json"):
            try:
                run = Running(**json.loads(path.read_text()))
            except (ValueError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if process_alive(run.pid) and same_program(cmdline(run.pid), run.argv):
                log.info("adopting %s (pid %d)", run.replica, run.pid)
                self.running[run.replica] = run
            else:
                run.state, run.reason = "Failed", "the process ended while the agent was away"
                self.failed[run.replica] = run
                path.unlink(missing_ok=True)

    # the loop

    def start(self, a: dict) -> None:
        try:
            port = self.ports.take()
        except OSError as exc:
            failed = self._record_of(a, 0, 0, list(a["command"]))
            failed.state, failed.reason = "Failed", f"cannot give the engine a port: {exc}"
            self.failed[a["replica"]] = failed
            return
        values = {
            "port": str(port),
            "model": a["model"],
            "gpus": ",".join(map(str, a["gpus"])),
            "replica": a["replica"],
            "rank": str(a["rank"]),
            "nnodes": str(a["nnodes"]),
            "master_addr": a.get("master_addr") or self.address,
            "host": "127.0.0.1",
            "gpu_memory_utilization": str(a.get("gpu_memory_utilization") or "0.9"),
        }
        argv = expand(a["command"], values)
        share = float(values["gpu_memory_utilization"])
        try:
            secret = resolve_env_from(a.get("env_from") or {})
        except EnvFromError as exc:
            failed = self._record_of(a, 0, port, argv)
            failed.state, failed.reason = "Failed", str(exc)
            self.failed[a["replica"]] = failed
            return
        env = {
            **engine_environment(self.state_dir),
            **a.get("env", {}),
            **secret,
            "CUDA_VISIBLE_DEVICES": values["gpus"],
            "GPUFLEET_REPLICA": a["replica"],
            "GPUFLEET_MODEL": a["model"],
            "GPUFLEET_PORT": values["port"],
            "NODE_RANK": values["rank"],
            "NNODES": values["nnodes"],
            "MASTER_ADDR": values["master_addr"],
        }
        log_path = self.logs / f"{a['replica']}.log"
        try:
            argv[0] = resolve(argv[0])
            with open(log_path, "ab") as log_file:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except OSError as exc:
            failed = self._record_of(a, 0, port, argv)
            failed.state, failed.reason = "Failed", f"cannot start {argv[0]}: {exc}"
            self.failed[a["replica"]] = failed
            return
        run = self._record_of(a, proc.pid, port, argv)
        run.memory_share = share
        self.children[proc.pid] = proc
        self.running[run.replica] = run
        self._save(run)
        log.info("started %s: pid %d port %d gpus %s", run.replica, proc.pid, port, a["gpus"])

    @staticmethod
    def _record_of(a: dict, pid: int, port: int, argv: list[str]) -> Running:
        return Running(
            a["replica"],
            a["model"],
            pid,
            port,
            argv,
            a["gpus"],
            a["rank"],
            a.get("health_path", "/health"),
            time.time(),
        )

    def stop(self, replica: str) -> None:
        run = self.running.pop(replica, None)
        if run is None:
            return
        run.stopping_since = time.monotonic()
        self.stopping[replica] = run
        self._signal(run, signal.SIGTERM)

    def kill(self, replica: str) -> bool:
        """Fault injection: the replica's process dies now, as if it had crashed."""
        run = self.running.get(replica)
        if run is None:
            return False
        self._signal(run, signal.SIGKILL)
        return True

    def refuse(self, replica: str, why: str) -> None:
        """Its GPU refused the engine memory (a simulated card: sim/fleet.py): it dies as an
        engine does on CUDA's out-of-memory error, and its report says why."""
        run = self.running.get(replica)
        if run is not None and self.kill(replica):
            run.refused = why

    def _signal(self, run: Running, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signum)

    def _exited(self, run: Running) -> int | None:
        """The exit code once the process is gone (None while it runs, -1 if unknown)."""
        child = self.children.get(run.pid)
        if child is not None:
            code = child.poll()
            if code is not None:
                self.children.pop(run.pid, None)
            return code
        return None if process_alive(run.pid) else -1

    def log_tail(self, replica: str, size: int = 4000) -> str:
        path = self.logs / f"{replica}.log"
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - size))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    async def check(self, session: aiohttp.ClientSession) -> None:
        """Notice exits, finish stops, and probe each engine's health path."""
        now = time.monotonic()
        for replica, run in list(self.stopping.items()):
            if self._exited(run) is not None:
                del self.stopping[replica]
                self._record_path(replica).unlink(missing_ok=True)
            elif now - run.stopping_since > self.stop_grace_s:
                self._signal(run, signal.SIGKILL)
        leaders = []
        for replica, run in list(self.running.items()):
            code = self._exited(run)
            if code is not None:
                run.state, run.exit_code = "Failed", code
                run.reason = run.refused or f"the engine exited with code {code}"
                del self.running[replica]
                self._record_path(replica).unlink(missing_ok=True)
                self.failed[replica] = run
                # Its workers may linger in the session: they must not keep the GPUs.
                self._signal(run, signal.SIGKILL)
                continue
            if run.rank != 0:
                run.state = "Ready"  # followers serve through the leader's endpoint
                continue
            leaders.append(run)
        for run in leaders:
            self._sleep_or_wake(session, run)
            if run.state == "Ready":
                self._sync_adapters(session, run)
        # An engine asleep by order is not probed (its health may fail while it sleeps); one
        # that sleeps by itself is, to see it wake.
        awake = [
            r
            for r in leaders
            if not (r.state == "Asleep" and r.sleep) and r.replica not in self.orders
        ]
        # All at once: one hung engine must not delay the others' probes or the heartbeat.
        await asyncio.gather(*(self._probe(session, run) for run in awake))
        for run in leaders:
            if run.state == "Starting" and time.time() - run.started_at > self.start_timeout_s:
                run.state, run.reason = "Failed", "not healthy within the start timeout"
                self.stop(run.replica)
                self.failed[run.replica] = run

    def _sleep_or_wake(self, session: aiohttp.ClientSession, run: Running) -> None:
        """Tell an engine to sleep or wake as the control plane wants, in the background: a
        level-1 sleep moves the weights to host memory, seconds the heartbeat must not wait."""
        control = control_of(run.engine_kind, run.engine_endpoints)
        if control is None or not control.takes_orders or run.replica in self.orders:
            return
        base = f"http://127.0.0.1:{run.port}"
        if run.sleep and run.state in ("Ready", "Unhealthy"):
            call, then = order(session, base, control.sleep, run.sleep), "Asleep"
        elif not run.sleep and run.state == "Asleep":
            call, then = order(session, base, control.wake), "Waking"
        else:
            return

        async def carry_out() -> None:
            try:
                failed = await call
            finally:
                self.orders.pop(run.replica, None)
            if failed:
                run.reason = f"{'sleep' if then == 'Asleep' else 'wake'} failed: {failed}"
                log.warning("%s: %s", run.replica, run.reason)
                return
            run.state, run.reason, run.failed_probes = then, "", 0
            if then == "Waking":
                await self._probe(session, run)  # Ready at once if its health answers
            self.news.set()

        self.orders[run.replica] = asyncio.ensure_future(carry_out())

    def _sync_adapters(self, session: aiohttp.ClientSession, run: Running) -> None:
        """Unload what the engine holds and is no longer assigned, then load what is assigned
        and not held (never again one that failed: the control plane decides what next), in
        the background, one replica's calls in order."""
        wanted = run.adapters_wanted or {}
        held = list(run.adapters or [])
        failures = run.adapter_failures or {}
        unload = adapters_to_unload(run, held)
        load = [a for a in wanted if a not in held and a not in failures]
        key = run.replica + "/adapters"
        if not (unload or load) or key in self.orders:
            return
        base = f"http://127.0.0.1:{run.port}"

        async def carry_out() -> None:
            try:
                for name in unload:
                    failed = await unload_adapter(session, base, run.engine_kind, name)
                    if not failed or failed.startswith("HTTP 404"):  # it holds none: gone
                        run.adapters = [a for a in (run.adapters or []) if a != name]
                        run.ever_assigned = [a for a in run.ever_assigned if a != name]
                for name in load:
                    failed = await load_adapter(session, base, run.engine_kind, name, wanted[name])
                    if failed:
                        run.adapter_failures = {**(run.adapter_failures or {}), name: failed}
                        log.warning("%s: adapter %s: %s", run.replica, name, failed)
                    else:
                        run.adapters = [*(run.adapters or []), name]
            finally:
                self.orders.pop(key, None)
            self.news.set()

        self.orders[key] = asyncio.ensure_future(carry_out())

    async def _probe(self, session: aiohttp.ClientSession, run: Running) -> None:
        url = f"http://127.0.0.1:{run.port}{run.health_path}"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                healthy = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            healthy = False
        control = control_of(run.engine_kind, run.engine_endpoints)
        if healthy and control is not None and not control.takes_orders:
            # An engine that sleeps by itself (llama.cpp): it says so, and stays routable.
            asleep = await sleeping(session, f"http://127.0.0.1:{run.port}", control)
            if asleep:
                run.state, run.failed_probes, run.reason = "Asleep", 0, "asleep by itself"
                return
        if healthy:
            run.state, run.failed_probes, run.reason = "Ready", 0, ""
            if run.adapter_resolver:
                await self._read_adapters(session, run)
        elif run.state not in ("Starting", "Waking"):
            run.failed_probes += 1
            if run.failed_probes >= UNHEALTHY_AFTER:
                run.state, run.reason = "Unhealthy", f"{run.health_path} is failing"

    async def _read_adapters(self, session: aiohttp.ClientSession, run: Running) -> None:
        """What an engine that loads adapters itself holds: the models its /v1/models lists
        with a `parent` (vLLM's LoRA modules). Unread, it stays as last known."""
        url = f"http://127.0.0.1:{run.port}/v1/models"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                listed = (await resp.json(content_type=None)).get("data", [])
                if resp.status != 200 or not isinstance(listed, list):
                    return
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
            return
        held = sorted(
            str(m["id"]) for m in listed if isinstance(m, dict) and m.get("parent") and "id" in m
        )
        if run.replica + "/adapters" not in self.orders:  # one under way says so as it ends
            run.adapters = held

    def reports(self) -> dict[str, dict]:
        out = {}
        for replica, run in self.running.items():
            out[replica] = {
                "state": run.state,
                "reason": run.reason,
                "url": f"http://{self.address}:{run.port}" if run.rank == 0 else "",
                "adapters": list(run.adapters or []),
                "adapter_failures": dict(run.adapter_failures or {}),
            }
        for replica, run in self.failed.items():
            out[replica] = {
                "state": "Failed",
                "reason": run.reason,
                "exit_code": run.exit_code,
                "log_tail": self.log_tail(replica),
            }
        for replica in self.stopping:
            out[replica] = {"state": "Stopping"}
        return out

    def stop_all(self, wait_s: float | None = None) -> None:
        """Stop every replica and wait for them (used when the agent shuts its node down)."""
        for replica in list(self.running):
            self.stop(replica)
        deadline = time.monotonic() + (self.stop_grace_s if wait_s is None else wait_s)
        while self.stopping and time.monotonic() < deadline:
            for replica, run in list(self.stopping.items()):
                if self._exited(run) is not None:
                    del self.stopping[replica]
                    self._record_path(replica).unlink(missing_ok=True)
            time.sleep(0.05)
        for run in self.stopping.values():
            self._signal(run, signal.SIGKILL)
            self._exited(run)
            self._record_path(run.replica).unlink(missing_ok=True)
        self.stopping.clear()

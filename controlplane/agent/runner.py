"""`gpuctl agent`'s lifecycle: one agent per node (one for a real node, many for a simulated
fleet) in one process, until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import aiohttp
from aiohttp import web

from controlplane.agent.agent import WATCH_S, ControlPlaneClient, Credential, NodeAgent
from controlplane.agent.processes import EnginePorts
from controlplane.agent.supervisor import Supervisor
from controlplane.vocabulary.looplag import watch_loop_lag
from controlplane.vocabulary.sdnotify import feed_watchdog, notify

WATCH_MAX_NODES = 256  # nodes in one agent process that each watch their orders

log = logging.getLogger("gpufleet.agent")


async def ready_once_heard(agents: list, server: str, every_s: float = 0.2) -> None:
    """READY=1 once every node this agent runs is registered and a heartbeat of it answered,
    so that `systemctl start` of a unit ordered after the agent's finds the nodes there; until
    then STATUS= says how many are and why the others are not, and they keep trying."""
    said = ""
    while True:
        waiting = [agent for agent in agents if not agent.beating.is_set()]
        if not waiting:
            break
        status = f"STATUS={len(agents) - len(waiting)} of {len(agents)} node(s) heard by {server}"
        if waiting[0].trouble:
            status += f"; {waiting[0].inventory.name}: {waiting[0].trouble}"
        if status != said:
            notify(status)
            said = status
        await asyncio.sleep(every_s)
    notify("READY=1", f"STATUS=running {len(agents)} node(s) against {server}")


async def run_agents(
    inventories,
    server: str,
    token: str | None,
    state_dir: Path,
    heartbeat_s: float = 2.0,
    stop_grace_s: float = 30.0,
    admin_app_factory=None,
    admin_listen: tuple[str, int] | None = None,
    stop_replicas_on_exit: bool = False,
    ssl=None,
    in_process=None,
    watch_s: float = WATCH_S,
) -> None:
    """`in_process`: what runs the replicas of the inventories whose `replicas` is
    "in_process" (a simulated fleet's choice, sim/replicas.py), started and closed here."""
    # One connection pool for every node this agent runs: a simulated fleet of 16,000 nodes
    # beating every 10 s must not queue its heartbeats behind aiohttp's default 100.
    connector = aiohttp.TCPConnector(limit=max(100, len(inventories) // 10))
    session = aiohttp.ClientSession(connector=connector)
    # Each node's watch of its orders stays parked on one connection of its own.
    watch_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    client = ControlPlaneClient(session, server, token, ssl, watch_session)
    ports = EnginePorts()
    if in_process is not None:
        await in_process.start()

    def supervisor_of(inv):
        if in_process is not None and getattr(inv, "replicas", "") == "in_process":
            return in_process.supervisor(inv.address)
        return Supervisor(state_dir / "nodes" / inv.name, inv.address, stop_grace_s, ports=ports)

    if watch_s > 0 and len(inventories) > WATCH_MAX_NODES:
        # One connection parked on the leader per node: a simulated fleet of thousands of
        # nodes in one process would hold as many sockets as its heartbeats' pool many times
        # over (16,000 watches lost heartbeats by the thousand). Its orders come by heartbeat.
        log.info(
            "%d nodes in one agent: orders come with heartbeats, not watches (at most %d)",
            len(inventories),
            WATCH_MAX_NODES,
        )
        watch_s = 0.0
    agents = {
        inv.name: NodeAgent(
            inv,
            supervisor_of(inv),
            client,
            heartbeat_s,
            Credential(state_dir / "nodes" / inv.name / "credential"),
            watch_s,
        )
        for inv in inventories
    }
    admin_runner = None
    if admin_app_factory is not None and admin_listen is not None:
        admin_runner = web.AppRunner(
            admin_app_factory(agents), access_log=None, handle_signals=False
        )
        await admin_runner.setup()
        await web.TCPSite(admin_runner, *admin_listen).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    tasks = [asyncio.create_task(agent.run()) for agent in agents.values()]
    tasks.append(asyncio.create_task(watch_loop_lag(log)))
    tasks.append(asyncio.create_task(feed_watchdog()))
    tasks.append(asyncio.create_task(ready_once_heard(list(agents.values()), server)))
    log.info("agent running %d node(s) against %s", len(agents), server)
    try:
        await stop.wait()
    finally:
        notify("STOPPING=1")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if stop_replicas_on_exit:
            for agent in agents.values():
                for replica in list(agent.supervisor.running):
                    agent.supervisor.stop(replica)
            for agent in agents.values():
                agent.supervisor.stop_all()
        for inv in inventories:
            close = getattr(inv, "close", None)
            if close is not None:
                close()
        await session.close()
        await watch_session.close()
        if admin_runner is not None:
            await admin_runner.cleanup()
        if in_process is not None:
            await in_process.close()

"""`gpuctl agent`: the node agent, for a real GPU node or a whole simulated fleet."""

import logging
import socket
import ssl
import sys
from pathlib import Path

import click

from cli.listen import parse_listen
from cli.paths import state_dir
from controlplane.agent.agent import WATCH_S
from controlplane.api.tokens import load_tokens
from controlplane.vocabulary.credentials import credential


@click.command("agent")
@click.option(
    "--server",
    "server_url",
    required=True,
    help="Control plane URL, or several, comma-separated: servers on one database (one leads).",
)
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False),
    help="CA certificate (PEM) that signed an https:// control plane's certificate.",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Agent token (or a YAML token file with an agent entry).",
)
@click.option(
    "--simulate",
    "fleet_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Simulate the fleet in FLEET.yaml instead of this node's GPUs ('-': a "
    "built-in demo fleet).",
)
@click.option("--name", default=None, help="Node name (default: the host name).")
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Address routers use to reach this node's replicas.",
)
@click.option("--fabric", default=None, help="Fabric label when NVML reports none.")
@click.option("--state-dir", "state_path", default=None, help="Replica records and logs.")
@click.option("--heartbeat", "heartbeat_s", default=2.0, show_default=True)
@click.option(
    "--watch",
    "watch_s",
    default=WATCH_S,
    show_default=True,
    help="Seconds one watch of this node's orders waits for news (0: heard by heartbeats only).",
)
@click.option(
    "--stop-grace",
    default=30.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when stopping a replica.",
)
@click.option(
    "--sim-admin",
    "admin_listen",
    default=None,
    help="HOST:PORT for fault injection (simulated fleets only).",
)
@click.option(
    "--stop-replicas-on-exit",
    is_flag=True,
    help="Stop this node's replicas when the agent exits (always for simulations).",
)
@click.option("--log-level", default="info", show_default=True)
def agent(
    server_url,
    ca_file,
    token_file,
    fleet_file,
    name,
    address,
    fabric,
    state_path,
    heartbeat_s,
    watch_s,
    stop_grace,
    admin_listen,
    stop_replicas_on_exit,
    log_level,
):
    """Run the node agent: discover GPUs, report health, run the assigned replicas."""
    import uvloop

    from controlplane.agent.runner import run_agents

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        tokens = load_tokens(token_file or credential("agent-token"))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    token = tokens.get("agent")
    admin = in_process = None
    if fleet_file is not None:
        from sim.admin import build_admin
        from sim.fleet import FleetFileError, load_fleet

        try:
            inventories = load_fleet(None if fleet_file == "-" else fleet_file, address)
        except (FleetFileError, OSError) as exc:
            raise click.UsageError(str(exc)) from None
        stop_replicas_on_exit = True
        admin = build_admin
        if any(inv.replicas == "in_process" for inv in inventories):
            from cli.cmd_sim_engine import settings_from_args
            from sim.replicas import InProcessReplicas

            in_process = InProcessReplicas(settings_from_args, inventories[0].address)
    else:
        from controlplane.agent.nvml import NvmlInventory, load_nvml

        nvml = load_nvml()
        if nvml is None:
            click.echo(
                "error: NVML found no NVIDIA GPU on this machine; use --simulate "
                "FLEET.yaml to run a simulated fleet",
                err=True,
            )
            sys.exit(1)
        inventories = [NvmlInventory(nvml, name or socket.gethostname(), address, fabric)]
    root = Path(state_path) if state_path else state_dir() / "agent"
    uvloop.run(
        run_agents(
            inventories,
            server_url,
            token,
            root,
            heartbeat_s,
            stop_grace,
            admin,
            parse_listen(admin_listen) if admin_listen else None,
            stop_replicas_on_exit,
            ssl.create_default_context(cafile=ca_file) if ca_file else None,
            in_process,
            watch_s=watch_s,
        )
    )

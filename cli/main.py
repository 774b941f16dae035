"""`gpuctl`: the operator CLI of gpufleet. One module per command, registered here."""

import click

from cli.cmd_agent import agent
from cli.cmd_apply import apply, cordon, delete, drain, scale, uncordon
from cli.cmd_routers import routers
from cli.cmd_server import server
from cli.cmd_sim import sim
from cli.cmd_sim_engine import sim_engine
from cli.cmd_status import status
from cli.cmd_stop_idle import stop_idle
from cli.cmd_tables import adapters, models, nodes, replicas
from cli.cmd_tenants import tenants, usage
from cli.cmd_up import up
from cli.context import Context


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--server",
    envvar="GPUCTL_SERVER",
    default=None,
    help="Control plane URL, or several comma-separated (servers on one database: the call "
    "follows the leader); default: GPUCTL_SERVER, the config file, http://127.0.0.1:8081.",
)
@click.option("--token", envvar="GPUCTL_TOKEN", default=None, help="Admin token.")
@click.option(
    "--ca-file",
    envvar="GPUCTL_CA_FILE",
    default=None,
    type=click.Path(dir_okay=False),
    help="CA certificate (PEM) that signed an https:// control plane's certificate.",
)
@click.option(
    "--color",
    "colour",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour: auto (on a terminal), always or never. NO_COLOR set always means never.",
)
@click.version_option(package_name="gpufleet", prog_name="gpuctl")
@click.pass_context
def gpuctl(click_ctx, server, token, ca_file, colour):
    """Operate a gpufleet: status, nodes, replicas, models, and the daemons themselves.

    Shell completion: eval "$(_GPUCTL_COMPLETE=bash_source gpuctl)" (zsh_source, fish_source).
    """
    click_ctx.obj = Context(server, token, colour, ca_file)


for command in (
    status,
    nodes,
    replicas,
    models,
    adapters,
    tenants,
    usage,
    routers,
    stop_idle,
    apply,
    delete,
    scale,
    cordon,
    uncordon,
    drain,
    up,
    server,
    agent,
    sim,
    sim_engine,
):
    gpuctl.add_command(command)


def main() -> None:
    gpuctl(auto_envvar_prefix="GPUCTL")

"""`gpuctl`: the operator CLI of gpufleet. One module per command, registered here."""

import click

from cli.cmd_agent import agent
from cli.cmd_server import server
from cli.cmd_sim_engine import sim_engine


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def gpuctl():
    """Operate a gpufleet: status, nodes, replicas, models, and the daemons themselves."""


gpuctl.add_command(sim_engine)
gpuctl.add_command(server)
gpuctl.add_command(agent)


def main() -> None:
    gpuctl(auto_envvar_prefix="GPUCTL")

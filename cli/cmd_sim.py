"""`gpuctl sim ...`: inject faults into a running simulated fleet."""

import click

from cli import client
from cli.context import Context, pass_context


@click.group("sim")
def sim():
    """Fault injection for a simulated fleet (gpuctl up, or gpuctl agent --simulate)."""


def _admin(ctx: Context, path: str, body: dict):
    return client.request(ctx.config.sim_admin, "POST", path, body)


@sim.command("gpu-fail")
@click.argument("node")
@click.argument("index", type=int)
@click.option("--reason", default="simulated XID 79: GPU has fallen off the bus")
@pass_context
def gpu_fail(ctx, node, index, reason):
    """Mark GPU INDEX of NODE unhealthy."""
    _admin(ctx, "/gpu/fail", {"node": node, "index": index, "reason": reason})
    click.echo(f"{node} gpu {index}: unhealthy ({reason})")


@sim.command("gpu-heal")
@click.argument("node")
@click.argument("index", type=int)
@pass_context
def gpu_heal(ctx, node, index):
    """Make GPU INDEX of NODE healthy again."""
    _admin(ctx, "/gpu/heal", {"node": node, "index": index})
    click.echo(f"{node} gpu {index}: healthy")


@sim.command("silence")
@click.argument("node")
@click.option("--resume", is_flag=True, help="Heartbeat again.")
@pass_context
def silence(ctx, node, resume):
    """Stop NODE's heartbeats (it becomes NotReady), or --resume them."""
    _admin(ctx, "/silence", {"node": node, "silent": not resume})
    click.echo(f"{node}: heartbeats {'resumed' if resume else 'stopped'}")


@sim.command("kill")
@click.argument("replica")
@pass_context
def kill(ctx, replica):
    """Kill REPLICA's engine process, as a crash would."""
    answer = _admin(ctx, "/kill", {"replica": replica})
    click.echo(f"{replica} killed on {answer['node']}")


@sim.command("memory")
@click.argument("replica")
@click.argument("mib", type=click.IntRange(min=0))
@pass_context
def memory(ctx, replica, mib):
    """Make REPLICA's engine take MIB of each of its cards, as one that overruns its share."""
    answer = _admin(ctx, "/memory", {"replica": replica, "mb": mib})
    click.echo(f"{replica} takes {mib} MiB per card on {answer['node']}")

"""`gpuctl routers`: the routers that report to the control plane, and `forget` for one that is
really gone. A silent router may be cut off and still serving: its replicas are of unknown use
until it reports again, a new incarnation of it starts, or it is forgotten here."""

import click

from cli.cmd_apply import say
from cli.cmd_tables import list_items
from cli.context import Context, pass_context
from cli.output import NO_HEADERS, OUTPUT
from cli.render import duration, table


def router_table(items, wide: bool, no_headers: bool, width: int = 0) -> str:
    headers = ["ID", "STATE", "LAST REPORT", "UPTIME", "REPLICAS", "IN FLIGHT"]
    if wide:
        headers += ["INCARNATION", "ROUTE VERSION"]
    rows = []
    for r in items:
        row = [
            r["id"],
            r["state"],
            duration(r["last_report_s"]) + " ago",
            duration(r["uptime_s"]),
            r["replicas_watched"],
            r["in_flight"],
        ]
        if wide:
            row += [r["incarnation"] or "-", r["route_version"]]
        rows.append(row)
    return table(headers, rows, no_headers, right={4, 5}, width=width)


@click.group("routers", invoke_without_command=True)
@OUTPUT
@NO_HEADERS
@click.pass_context
def routers(click_ctx, output: str, no_headers: bool):
    """List routers: live, silent (stopped reporting, may still serve) or gone."""
    if click_ctx.invoked_subcommand is not None:
        return
    ctx = click_ctx.find_object(Context)
    list_items(ctx, "/v1/routers", "router", "id", router_table, output, no_headers)


@routers.command("forget")
@click.argument("router_id")
@OUTPUT
@pass_context
def forget(ctx: Context, router_id: str, output: str):
    """Forget ROUTER_ID, a router that is really gone (its replicas' idle bounds restart now)."""
    answer = ctx.delete(f"/v1/routers/{router_id}")
    say(output, answer, f"router/{answer['id']}", "forgotten")

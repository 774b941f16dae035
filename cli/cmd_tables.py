"""`gpuctl nodes`, `gpuctl replicas`, `gpuctl models`: the tables, from one snapshot each."""

import click

from cli.context import NO_HEADERS, OUTPUT, Context, pass_context
from cli.render import duration, echo_json, idle_text, table, truncate


def node_table(items, wide: bool, no_headers: bool) -> str:
    headers = [
        "NAME",
        "STATUS",
        "FABRIC",
        "CLASS",
        "USED",
        "FREE",
        "UNHEALTHY",
        "TOTAL",
        "REPLICAS",
    ]
    if wide:
        headers.append("ADDRESS")
    rows = []
    for n in items:
        g = n["gpus"]
        row = [
            n["name"],
            n["status"],
            n["fabric"],
            ",".join(n["gpu_classes"]) or "-",
            g["used"],
            g["free"],
            g["unhealthy"],
            g["total"],
            n["replicas"],
        ]
        if wide:
            row.append(n["address"])
        rows.append(row)
    return table(headers, rows, no_headers, right={4, 5, 6, 7, 8})


def replica_table(items, wide: bool, no_headers: bool) -> str:
    headers = ["NAME", "MODEL", "STATE", "NODES", "GPUS", "IDLE", "AGE"]
    if wide:
        headers += ["URL", "REASON"]
    rows = []
    for r in items:
        row = [
            r["id"],
            r["model"],
            r["state"],
            ",".join(r["nodes"]),
            r["gpus"],
            idle_text(r["idle_s"], r["idle_state"]),
            duration(r["age_s"]),
        ]
        if wide:
            row += [r["url"] or "-", r["reason"] or "-"]
        rows.append(row)
    return table(headers, rows, no_headers, right={4})


def model_table(items, wide: bool, no_headers: bool) -> str:
    headers = ["NAME", "CLASS", "GPUS", "READY", "STATE"]
    headers += ["NODES/REPLICA", "IDLE AFTER", "GEN", "REASON"] if wide else ["REASON"]
    rows = []
    for m in items:
        row = [
            m["name"],
            m["gpu_class"],
            m["gpus_per_replica"],
            f"{m['ready']}/{m['desired']}",
            m["state"],
        ]
        if wide:
            row += [
                m["nodes_per_replica"],
                duration(m["idle_after_s"]),
                m["generation"],
                m["reason"] or "-",
            ]
        else:
            row.append(truncate(m["reason"], 30) if m["reason"] else "-")
        rows.append(row)
    return table(headers, rows, no_headers, right={2})


def _list_command(name: str, path: str, render, help_text: str):
    @click.command(name, help=help_text)
    @OUTPUT
    @NO_HEADERS
    @pass_context
    def command(ctx: Context, output: str, no_headers: bool):
        answer = ctx.get(path)
        if output == "json":
            echo_json(answer)
        elif not answer["items"]:
            click.echo(f"No {name} found.", err=True)
        else:
            click.echo(render(answer["items"], output == "wide", no_headers))

    return command


nodes = _list_command("nodes", "/v1/nodes", node_table, "List nodes and their GPUs.")
replicas = _list_command(
    "replicas", "/v1/replicas", replica_table, "List replicas, with how long each has gone unused."
)
models = _list_command("models", "/v1/models", model_table, "List models and their state.")

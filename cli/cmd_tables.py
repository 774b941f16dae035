"""`gpuctl nodes`, `gpuctl replicas`, `gpuctl models`: the tables, from one snapshot each."""

import time
from urllib.parse import urlencode

import click

from cli.context import Context, pass_context
from cli.output import INTERVAL, NO_HEADERS, OUTPUT, WATCH, emit, terminal_width, watching
from cli.render import duration, idle_text, table


def card_residents(cards: list[dict]) -> str:
    """Each occupied card's share of memory held and who is on it, then how many are empty:
    `0:62%[a-1f2e,b-3c4d] 3:27%[c-5a6b] +6 empty`."""
    shown = []
    for card in cards:
        if card["residents"]:
            share = f"{100 * card['held_mb'] // card['memory_mb']}%" if card["memory_mb"] else "?"
            shown.append(f"{card['index']}:{share}[{','.join(card['residents'])}]")
    empty = sum(1 for card in cards if not card["residents"])
    return " ".join(shown + ([f"+{empty} empty"] if empty else [])) or "-"


def node_table(items, wide: bool, no_headers: bool, width: int = 0) -> str:
    headers = [
        "NAME",
        "STATUS",
        "FABRIC",
        "CLASS",
        "USED",
        "FREE",
        "UNHEALTHY",
        "OTHER",
        "TOTAL",
        "REPLICAS",
    ]
    if wide:
        headers += ["ADDRESS", "CARDS"]
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
            g["unavailable"],  # healthy, unheld, on a node that takes no work
            g["total"],
            n["replicas"],
        ]
        if wide:
            row += [n["address"], card_residents(n.get("cards", []))]
        rows.append(row)
    return table(headers, rows, no_headers, right={4, 5, 6, 7, 8, 9}, width=width)


def adapter_cell(row: dict) -> str:
    """The adapters a replica serves, and how its loads came about: `2 (1+1)` is two served,
    one load the control plane ordered and one its engine made on a request."""
    loads = row.get("adapter_loads") or {}
    ordered, resolved = loads.get("ordered", 0), loads.get("resolved", 0)
    served = len(row.get("adapters") or [])
    if not (served or ordered or resolved):
        return "-"
    return f"{served} ({ordered}+{resolved})"


def replica_table(items, wide: bool, no_headers: bool, width: int = 0) -> str:
    headers = ["NAME", "MODEL", "STATE", "NODES", "GPUS", "IDLE", "AGE"]
    if wide:
        headers += ["WAITING", "RUNNING", "KV", "READ", "ADAPTERS", "CARDS", "URL", "REASON"]
    rows = []
    for r in items:
        placement = r.get("placement") or []
        cards = sum(len(p["gpus"]) for p in placement)
        row = [
            r["id"],
            r["model"],
            r["state"],
            ",".join(r["nodes"]),
            # An engine asleep keeps only a reserve of its cards' memory: in parentheses.
            f"({cards})" if r["state"] == "Asleep" and not r["gpus"] else r["gpus"],
            idle_text(r["idle_s"], r["idle_state"]),
            duration(r["age_s"]),
        ]
        if wide:
            shown = " ".join(f"{p['node']}:{','.join(map(str, p['gpus']))}" for p in placement)
            row += engine_load_cells(r.get("engine_load"))
            row += [adapter_cell(r), shown or "-", r["url"] or "-", r["reason"] or "-"]
        rows.append(row)
    return table(headers, rows, no_headers, right={4, 7, 8, 9} if wide else {4}, width=width)


def engine_load_cells(load: dict | None) -> list[str]:
    """WAITING, RUNNING, KV and READ (how long ago): the engine's own load as routers last
    read it; dashes when no router reads it (no traffic in the last minute)."""
    if not load:
        return ["-", "-", "-", "-"]
    return [
        str(load["waiting"]),
        str(load["running"]),
        f"{load['kv_use']:.0%}",
        f"{load['age_s']:.1f}s ago",
    ]


def gpus_per_replica(m: dict) -> str:
    """What one replica holds: `8`, or `16 (8x2)` for one that spans two nodes."""
    per_node, nodes = m["gpus_per_replica"], m["nodes_per_replica"]
    return str(per_node) if nodes == 1 else f"{per_node * nodes} ({per_node}x{nodes})"


def model_table(items, wide: bool, no_headers: bool, width: int = 0) -> str:
    headers = ["NAME", "CLASS", "GPUS", "SCALE", "STATE"]
    headers += ["NODES/REPLICA", "IDLE AFTER", "GEN", "REASON"] if wide else ["REASON"]
    rows = []
    for m in items:
        # SCALE: ready / kept now (fewer than the spec's while scaled down, anywhere within
        # the bounds when autoscaled) / the floor, and `..max` when load moves it
        scale = f"{m['ready']}/{m['desired']}/{m['min_replicas']}"
        scaling = m.get("autoscale")
        if m.get("target_in_flight") is not None:
            scale += f"..{m['max_replicas']}"
        row = [m["name"], m["gpu_class"], gpus_per_replica(m), scale]
        row.append(m["state"])
        if wide:
            row += [m["nodes_per_replica"], duration(m["idle_after_s"]), m["generation"]]
        # The row already names the model and its READY count: the reason starts at what is
        # missing ("needs 8 free H100-80GB GPUs on one node; the best ... has 6").
        reason = m["reason"].partition(" cannot be placed: ")[2] or m["reason"]
        row.append(reason or (scaling["reason"] if scaling else "") or "-")
        rows.append(row)
    return table(headers, rows, no_headers, right={2}, width=width)


CHUNK_SIZE = click.option(
    "--chunk-size",
    default=500,
    show_default=True,
    type=click.IntRange(min=0, max=10_000),
    help="Fetch the list this many items a request (0: all in one).",
)


def fetch_list(ctx: Context, path: str, chunk_size: int = 500) -> dict:
    """The whole list, a page at a time: a fleet's 16,000 nodes are many small answers, not
    one of 10 MB. A server that does not page answers the first request whole."""
    if not chunk_size:
        return ctx.get(path)
    items, token = [], None
    while True:
        query = {"limit": chunk_size, **({"continue": token} if token else {})}
        answer = ctx.get(f"{path}?{urlencode(query)}")
        items += answer["items"]
        token = answer.pop("metadata", {}).get("continue")
        if not token:
            return {**answer, "items": items}


def list_items(
    ctx: Context, path: str, kind: str, key: str, render, output: str, no_headers, chunk_size=500
):
    """GET a list and show it: `render(items, wide, no_headers, width)` for humans."""
    answer = fetch_list(ctx, path, chunk_size)
    items = answer["items"]
    if not items and output in ("table", "wide"):
        click.echo(f"No {kind}s found.", err=True)
        return

    def human(wide: bool) -> str:
        # The last column (free text) fits the terminal; -o wide shows it whole.
        return render(items, wide, no_headers, 0 if wide else terminal_width())

    emit(output, answer, human, [f"{kind}/{item[key]}" for item in items])


def _list_command(name: str, path: str, kind: str, render, help_text: str):
    @click.command(name, help=help_text)
    @OUTPUT
    @NO_HEADERS
    @WATCH
    @INTERVAL
    @CHUNK_SIZE
    @pass_context
    def command(
        ctx: Context, output: str, no_headers: bool, watch: bool, interval: float, chunk_size: int
    ):
        key = "id" if kind == "replica" else "name"
        watching(
            lambda: list_items(ctx, path, kind, key, render, output, no_headers, chunk_size),
            watch,
            interval,
        )

    return command


@click.group("nodes", invoke_without_command=True)
@OUTPUT
@NO_HEADERS
@WATCH
@INTERVAL
@CHUNK_SIZE
@pass_context
@click.pass_context
def nodes(
    click_ctx,
    ctx: Context,
    output: str,
    no_headers: bool,
    watch: bool,
    interval: float,
    chunk_size: int,
):
    """List nodes and their GPUs; `nodes delete NAME` removes one."""
    if click_ctx.invoked_subcommand is not None:
        return
    watching(
        lambda: list_items(
            ctx, "/v1/nodes", "node", "name", node_table, output, no_headers, chunk_size
        ),
        watch,
        interval,
    )


@nodes.command("delete")
@click.argument("name")
@OUTPUT
@pass_context
def delete_node(ctx: Context, name: str, output: str):
    """Remove node NAME: its credential is revoked (its agent is refused from now on) and its
    replicas are placed elsewhere."""
    answer = ctx.delete(f"/v1/nodes/{name}")
    emit(output, answer, lambda wide: f"node/{answer['name']} deleted", [f"node/{name}"])


replicas = _list_command(
    "replicas",
    "/v1/replicas",
    "replica",
    replica_table,
    "List replicas, with how long each has gone unused.",
)


@click.command("models")
@click.argument("name", required=False)
@OUTPUT
@NO_HEADERS
@WATCH
@INTERVAL
@pass_context
def models(ctx: Context, name, output: str, no_headers: bool, watch: bool, interval: float):
    """List models and their state; with NAME, one model with its replicas and events."""

    def show():
        if name is None:
            return list_items(ctx, "/v1/models", "model", "name", model_table, output, no_headers)
        answer = ctx.get(f"/v1/models/{name}")
        emit(output, answer, lambda wide: describe_model(answer, wide), [f"model/{name}"])

    watching(show, watch, interval)


def describe_model(m: dict, wide: bool) -> str:
    spec = m["spec"]
    lines = [
        f"NAME         {m['name']}",
        f"STATE        {m['state']}   READY {m['ready']}/{m['desired']}"
        f" (spec {m['replicas']}, min {m['min_replicas']})",
        f"GPUS         {gpus_per_replica(m)} {m['gpu_class']} per replica",
        f"IDLE AFTER   {duration(m['idle_after_s'])}",
        f"GENERATION   {m['generation']}",
        f"COMMAND      {' '.join(spec['command'])}",
    ]
    if m.get("target_in_flight") is not None:
        target = m["target_in_flight"]
        lines.append(
            f"AUTOSCALE    {m['min_replicas']}..{m['max_replicas']} replicas,"
            f" {target:g} in flight each, in after {duration(m['scale_down_delay_s'])} lower"
        )
        if m.get("autoscale"):
            lines.append(f"LOAD         {m['autoscale']['reason']}")
    if spec.get("sleep_level") is not None:
        after = spec.get("sleep_after_s")
        lines.append(
            f"SLEEP        {spec.get('engine')} level {spec['sleep_level']}"
            + (f", after {duration(after)} idle" if after is not None else ", by itself")
            + f"; wake within {duration(spec.get('wake_timeout_s') or 0)} or restart cold"
        )
    if m["reason"]:
        lines.append(f"REASON       {m['reason']}")
    lines += ["", "REPLICAS"]
    if m["replicas"]:
        lines.append(replica_table(m["replicas"], wide, False, 0 if wide else terminal_width()))
    else:
        lines.append("  none")
    lines += ["", "EVENTS"]
    now = time.time()
    rows = [[duration(now - e["at"]) + " ago", e["message"]] for e in m["events"][-20:]]
    lines.append(
        table(["AGE", "MESSAGE"], rows, width=0 if wide else terminal_width()) if rows else "  none"
    )
    return "\n".join(lines)


def adapter_table(items, wide: bool, no_headers: bool, width: int = 0) -> str:
    headers = ["NAME", "BASE", "STATE", "LOADED ON", "IDLE", "WAITING"]
    headers += ["SOURCE", "REASON"] if wide else ["REASON"]
    rows = []
    for a in items:
        loaded = [h for h in a["replicas"] if h["state"] == "Loaded"]
        row = [
            a["name"],
            a["base"],
            a["state"],
            ",".join(h["replica"] for h in loaded) or "-",
            " ".join(idle_text(h["idle_s"], h["idle_state"]) for h in loaded) or "-",
            a["waiting"],
        ]
        failed = "; ".join(f"{h['replica']}: {h['reason']}" for h in a["replicas"]
                           if h["state"] == "Failed")  # fmt: skip
        reason = a["reason"] or failed or "-"
        row += [a["source"], reason] if wide else [reason]
        rows.append(row)
    return table(headers, rows, no_headers, right={5}, width=width)


@click.command("adapters")
@click.argument("name", required=False)
@OUTPUT
@NO_HEADERS
@WATCH
@INTERVAL
@pass_context
def adapters(ctx: Context, name, output: str, no_headers: bool, watch: bool, interval: float):
    """List LoRA adapters: where each is loaded, how long unused there, and why one is not
    loaded anywhere; with NAME, one adapter with its events."""

    def show():
        if name is None:
            return list_items(
                ctx, "/v1/adapters", "adapter", "name", adapter_table, output, no_headers
            )
        answer = ctx.get(f"/v1/adapters/{name}")

        def human(wide: bool) -> str:
            now = time.time()
            events = [[duration(now - e["at"]) + " ago", e["message"]] for e in answer["events"]]
            lines = [adapter_table([answer], True, False, 0), "", "EVENTS"]
            lines.append(table(["AGE", "MESSAGE"], events) if events else "  none")
            return "\n".join(lines)

        emit(output, answer, human, [f"adapter/{name}"])

    watching(show, watch, interval)

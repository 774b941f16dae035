"""`gpuctl status`: the whole fleet on one screen, at 4 nodes or 2,000."""

import textwrap

import click

from cli.context import Context, pass_context
from cli.output import INTERVAL, OUTPUT, WATCH, emit, terminal_width, watching
from cli.render import bar, duration, idle_text, paint, table, truncate
from controlplane.vocabulary.specs import parse_duration

MAX_LINES = 4  # per list, so that the screen stays one screen at 2,000 nodes


def gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


def deciding_fabrics(s: dict) -> list[dict]:
    """For each GPU class that a multi-node model cannot be placed on, the fabric closest to
    fitting it (most whole free nodes of that class): what an operator must see to act."""
    groups = s.get("fabrics_by_class", [])
    wanted = {u["gpu_class"] for u in s["unplaceable"] if u.get("nodes_per_replica", 1) > 1}
    best = []
    for gpu_class in sorted(wanted):
        mine = [g for g in groups if g["gpu_class"] == gpu_class]
        if mine:
            best.append(max(mine, key=lambda g: (g["whole_free"], g["ready"], g["fabric"])))
    return best


def fabric_lines(s: dict) -> list[str]:
    groups = s.get("fabrics_by_class", [])
    if not groups:
        return []
    shown = deciding_fabrics(s)
    # Then where a multi-node replica could go first: most whole free nodes at the top.
    for group in sorted(groups, key=lambda g: (-g["whole_free"], g["fabric"], g["gpu_class"])):
        if len(shown) >= max(MAX_LINES, len(deciding_fabrics(s))):
            break
        if group not in shown:
            shown.append(group)
    rows = [[g["fabric"], g["gpu_class"], g["nodes"], g["ready"], g["whole_free"]] for g in shown]
    out = [table(["FABRIC", "CLASS", "NODES", "READY", "WHOLE NODES FREE"], rows, right={2, 3, 4})]
    if len(groups) > len(shown):
        out.append(f"… and {len(groups) - len(shown)} more fabric/class groups (gpuctl nodes)")
    return out + [""]


def gpu_hours(ctx: Context) -> dict | None:
    """The last day's GPU-hours, charged and unallocated (None from a server without them)."""
    try:
        usage = ctx.get("/v1/usage?since=24h")
    except click.ClickException:
        return None
    if "fleet_gpu_seconds" not in usage:
        return None
    return {
        "fleet": usage["fleet_gpu_seconds"] / 3600,
        "unallocated": usage["unallocated_gpu_seconds"] / 3600,
    }


def gpu_hours_line(s: dict, colour: bool) -> list[str]:
    hours = s.get("gpu_hours")
    if not hours or not hours["fleet"]:
        return []
    line = f"GPU-hours (24h): {hours['fleet']:.1f} on awake engines"
    if hours["unallocated"] >= 0.05:
        line += ", " + paint(f"{hours['unallocated']:.1f} unallocated", "yellow", colour)
        line += " (idle, no owner: gpuctl usage)"
    return [line, ""]


def render_status(s: dict, colour: bool, width: int = 80) -> str:
    out = []
    nodes = s["nodes"]
    head = f"{nodes['total']} nodes ({nodes['ready']} Ready"
    if nodes["not_ready"]:
        head += ", " + paint(f"{nodes['not_ready']} NotReady", "red", colour)
    if nodes["cordoned"] or nodes["draining"]:
        head += f", {nodes['cordoned']} cordoned, {nodes['draining']} draining"
    head += f")   {len(s['fabrics'])} fabric(s)"
    if "auth" in s:  # what routers ask of a request: a tenant's key, or none
        head += f"   auth: {s['auth']}"
    out.append(paint("FLEET", "bold", colour) + "  " + head)
    out.append("")
    rows = []
    for gpu_class, c in s["capacity"].items():
        share = f"{100 * c['used'] // c['total']}%" if c["total"] else "-"
        memory = s.get("memory", {}).get(gpu_class, {"held_mb": 0, "total_mb": 0})
        held, total = memory["held_mb"], memory["total_mb"]
        memory_share = f"{100 * held // total}%" if total else "-"
        rows.append(
            [
                gpu_class,
                c["used"],
                c["free"],
                c["unhealthy"],
                c["unavailable"],
                c["total"],
                bar(c["used"], c["total"], 6, colour) + " " + share.rjust(4),
                bar(held, total, 6, colour) + " " + memory_share.rjust(4),
            ]
        )
    if rows:
        out.append(
            table(
                ["GPU CLASS", "USED", "FREE", "UNHEALTHY", "OTHER", "TOTAL", "USAGE", "MEMORY"],
                rows,
                right={1, 2, 3, 4, 5},
                gap=2,  # eight columns in 80
            )
        )
    else:
        out.append("No GPUs registered yet.")
    out.append("")
    out += gpu_hours_line(s, colour)
    out += fabric_lines(s)

    def counts(section):
        by_state = section["by_state"]
        parts = [f"{n} {state}" for state, n in by_state.items()]
        return f"{section['total']}" + (f" ({', '.join(parts)})" if parts else "")

    out.append(f"MODELS    {counts(s['models'])}")
    asleep = s.get("scaled_to_zero", {})
    if asleep.get("models") or asleep.get("waking"):
        waking = asleep.get("waking", {})
        line = (
            f"          {asleep['models']} scaled to zero, {asleep['gpus_held']} GPU(s) still held"
            " (retiring)"
        )
        if waking:
            line += f"; {len(waking)} waking: {sum(waking.values())} request(s) waiting"
        out.append(line)
    room = s.get("room", {})
    if room.get("swaps_last_hour") or room.get("waiting_for_room"):
        out.append(
            f"          {room['swaps_last_hour']} swap(s) in the last hour;"
            f" {len(room['waiting_for_room'])} model(s) waiting for room"
        )
    out.append(f"REPLICAS  {counts(s['replicas'])}")
    sleepers = s.get("asleep", {})
    if sleepers.get("replicas"):
        out.append(
            f"ASLEEP    {sleepers['replicas']} replica(s) on {sleepers['cards']} card(s):"
            f" {gib(sleepers['gpu_memory_mb'])} of GPU memory,"
            f" {gib(sleepers['host_memory_mb'])} of host memory kept"
        )
    adapters = s.get("adapters", {})
    if adapters.get("total"):
        out.append(
            f"ADAPTERS  {adapters['total']} ({adapters['loaded']} loaded, on"
            f" {adapters['loaded_replicas']} replica slot(s); {adapters['unused']} unused past"
            f" their idle_after; {len(adapters['waiting'])} waiting to be loaded)"
        )
    r = s.get("routers", {})
    if r.get("live") or r.get("silent"):
        out.append(f"ROUTERS   {r['live'] + r['silent']} ({r['live']} live, {r['silent']} silent)")

    problems = [
        (
            "NOT READY NODES",
            "red",
            [f"{n['name']} ({n['fabric']}): no heartbeat" for n in s["not_ready_nodes"]],
        ),
        (
            "FAILED REPLICAS",
            "red",
            [
                f"{r['id']} on {','.join(r['nodes']) or '-'}: {r['reason']}"
                for r in s["failed_replicas"]
            ],
        ),
        (
            "DEGRADED REPLICAS",
            "red",
            [
                f"{r['id']} ({r['model']}): {r['reason']}; being replaced"
                for r in s.get("degraded_replicas", [])
            ],
        ),
        (
            "UNHEALTHY GPUS",
            "red",
            [f"{g['node']} gpu {g['index']}: {g['reason']}" for g in s["unhealthy_gpus"]],
        ),
        ("CANNOT BE PLACED", "yellow", [item["reason"] for item in s["unplaceable"]]),
        (
            "WAITING FOR ROOM",
            "yellow",
            [f"{m}: {why}" for m, why in s.get("room", {}).get("waiting_for_room", {}).items()],
        ),
    ]
    for title, tint, lines in problems:
        if lines:
            out.append("")
            out.append(paint(f"{title} ({len(lines)})", tint, colour))
            for line in lines[:MAX_LINES]:
                # Two lines at most: a reason's end ("the best node has 6") is what one acts on.
                wrapped = textwrap.wrap(line, width - 2, subsequent_indent="    ")
                if len(wrapped) > 2:
                    wrapped = [wrapped[0], truncate(" ".join(wrapped[1:]), width - 2)]
                out += ["  " + part for part in wrapped]
            if len(lines) > MAX_LINES:
                out.append(f"  … and {len(lines) - MAX_LINES} more")
    idle = s["idle"]
    out.append("")
    threshold = (
        duration(idle["threshold_s"])
        if idle["threshold_s"] is not None
        else "each model's idle_after"
    )
    title = (
        f"UNUSED PAST {threshold}: {len(idle['replicas'])} replica(s) holding "
        f"{idle['gpus_held']} GPU(s)"
    )
    out.append(paint(title, "yellow" if idle["replicas"] else "", colour))
    if idle["replicas"]:
        rows = [
            [
                r["id"],
                r["model"],
                truncate(",".join(r["nodes"]), 20),
                r["gpus"],
                idle_text(r["idle_s"], r["idle_state"]),
            ]
            for r in idle["replicas"][:MAX_LINES]
        ]
        out.append(
            table(
                ["  REPLICA", "MODEL", "NODES", "GPUS", "IDLE"],
                [["  " + str(r[0]), *r[1:]] for r in rows],
                right={3},
            )
        )
        if len(idle["replicas"]) > MAX_LINES:
            out.append(f"  … and {len(idle['replicas']) - MAX_LINES} more (gpuctl replicas)")
    routers = s.get("routers", {})
    if idle["unknown"]:
        silent_part = (
            f", {routers['unknown_replicas']} of them held by a silent router"
            if routers.get("unknown_replicas")
            else ""
        )
        out.append(
            paint(
                f"  {idle['unknown']} replica(s) of unknown use, never counted as idle"
                + silent_part,
                "dim",
                colour,
            )
        )
    if routers.get("silent"):
        out.append(
            paint(
                f"SILENT ROUTERS  {routers['silent']} (stopped reporting, may still be serving): "
                f"{routers['unknown_replicas']} replica(s) unknown because of them"
                " (gpuctl routers; gpuctl routers forget ID once one is really gone)",
                "yellow",
                colour,
            )
        )
    return "\n".join(out)


@click.command("status")
@OUTPUT
@click.option("--json", "as_json", is_flag=True, help="Same as -o json.")
@click.option(
    "--idle-after",
    default=None,
    help="List replicas unused for longer than this (e.g. 90s, 30m, 2h); default: each"
    " model's idle_after.",
)
@WATCH
@INTERVAL
@pass_context
def status(ctx: Context, output: str, as_json: bool, idle_after, watch: bool, interval: float):
    """How full the fleet is, what is broken, what cannot be placed, what nobody uses."""
    if output == "name":
        raise click.UsageError("status is a summary with no names: use -o json or -o yaml")
    query = ""
    if idle_after is not None:
        try:
            query = f"?idle_after={parse_duration(idle_after, 'idle-after')}"
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--idle-after") from None

    def show():
        answer = ctx.get("/v1/summary" + query)
        if output in ("table", "wide") and not as_json:
            answer["gpu_hours"] = gpu_hours(ctx)

        def human(wide: bool) -> str:
            # -o wide: reasons whole, however long
            return render_status(answer, ctx.colour, 10_000 if wide else terminal_width())

        emit("json" if as_json else output, answer, human, [], colour=ctx.colour)

    watching(show, watch, interval)

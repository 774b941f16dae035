"""`gpuctl tenants` (list, create-key, revoke-key) and `gpuctl usage`: who calls the routers,
with which keys, and what each used."""

import time

import click

from cli.context import Context, pass_context
from cli.output import NO_HEADERS, OUTPUT, emit, terminal_width
from cli.render import duration, table


def _limit(value) -> str:
    return "-" if value is None else f"{value:,}"


def _last_used(key: dict, now: float) -> str:
    return duration(now - key["last_used"]) + " ago" if key["last_used"] else "never"


def tenant_table(items, wide: bool, no_headers: bool, width: int = 0) -> str:
    headers = ["NAME", "REQ/MIN", "TOKENS/MIN", "IN-FLIGHT", "WEIGHT", "PRIORITY", "KEYS"]
    if wide:
        headers += ["MODELS", "KEY IDS (LAST USED)"]
    now = time.time()
    rows = []
    for t in items:
        row = [
            t["name"],
            _limit(t["requests_per_minute"]),
            _limit(t["tokens_per_minute"]),
            _limit(t["max_in_flight"]),
            f"{t['weight']:g}",
            t["priority"],
            len(t["keys"]),
        ]
        if wide:
            used = [f"{k['id']} ({_last_used(k, now)})" for k in t["keys"]]
            row += [",".join(t["models"]) or "*", " ".join(used) or "-"]
        rows.append(row)
    return table(headers, rows, no_headers, right={1, 2, 3, 4, 5, 6}, width=width)


@click.group("tenants", invoke_without_command=True)
@OUTPUT
@NO_HEADERS
@pass_context
@click.pass_context
def tenants(click_ctx, ctx: Context, output: str, no_headers: bool):
    """List tenants, their limits and key ids (never a key); `create-key`, `revoke-key`.
    Tenants are applied as `kind: tenant` documents with `gpuctl apply -f`."""
    if click_ctx.invoked_subcommand is not None:
        return
    answer = ctx.get("/v1/tenants")
    items = answer["items"]
    if not items and output in ("table", "wide"):
        click.echo("No tenants found.", err=True)
        return
    emit(
        output,
        answer,
        lambda wide: tenant_table(items, wide, no_headers, 0 if wide else terminal_width()),
        [f"tenant/{t['name']}" for t in items],
    )


@tenants.command("create-key")
@click.argument("name")
@OUTPUT
@pass_context
def create_key(ctx: Context, name: str, output: str):
    """Make a key for tenant NAME; it is shown this once, and only its SHA-256 is kept."""
    answer = ctx.post(f"/v1/tenants/{name}/keys")
    emit(
        output,
        answer,
        lambda wide: (
            f"{answer['key']}\nkey id {answer['id']} for tenant {name}: keep the key"
            " now, it cannot be shown again"
        ),
        [f"key/{answer['id']}"],
    )


@tenants.command("revoke-key")
@click.argument("key_id", metavar="KEY-ID")
@OUTPUT
@pass_context
def revoke_key(ctx: Context, key_id: str, output: str):
    """Revoke a key by its id: every router refuses it from the next route version."""
    answer = ctx.delete(f"/v1/keys/{key_id}")
    emit(output, answer, lambda wide: f"key/{answer['id']} revoked", [f"key/{answer['id']}"])


def usage_table(items, wide: bool, no_headers: bool, width: int = 0) -> str:
    headers = ["TENANT", "MODEL", "REQUESTS", "ERRORS", "429", "PROMPT", "COMPLETION", "GPU-H"]
    if wide:
        headers += ["ASLEEP GIB-H", "QUEUE WAIT"]
    rows = []
    for u in items:
        row = [
            u["tenant"],
            u["model"],
            f"{u['requests']:,}",
            f"{u['errors']:,}",
            f"{u['rate_limited']:,}",
            f"{u['prompt_tokens']:,}",
            f"{u['completion_tokens']:,}",
            f"{u.get('gpu_seconds', 0) / 3600:.2f}",
        ]
        if wide:
            row += [f"{u.get('asleep_gib_seconds', 0) / 3600:.2f}", f"{u['queue_wait_s']:.1f}s"]
        rows.append(row)
    return table(headers, rows, no_headers, right={2, 3, 4, 5, 6, 7, 8, 9}, width=width)


@click.command("usage")
@click.option("--since", default="1h", show_default=True, help="How far back (at most 24h).")
@click.option("--tenant", default=None, help="One tenant only.")
@OUTPUT
@NO_HEADERS
@pass_context
def usage(ctx: Context, since: str, tenant: str | None, output: str, no_headers: bool):
    """Requests, errors, 429s and tokens per tenant and model, as the routers reported them,
    and the GPU-hours each was charged: a model's card time split by the tokens each tenant
    was served in each minute; its idle minutes charged to its spec's `owner`, else to
    (unallocated)."""
    query = f"/v1/usage?since={since}" + (f"&tenant={tenant}" if tenant else "")
    answer = ctx.get(query)
    items = answer["items"]
    if not items and output in ("table", "wide"):
        click.echo(f"No usage in the last {since}.", err=True)
        return
    def shown(wide: bool) -> str:
        text = usage_table(items, wide, no_headers, 0 if wide else terminal_width())
        if no_headers or "fleet_gpu_seconds" not in answer:
            return text
        return text + (
            f"\nGPU-hours: fleet {answer['fleet_gpu_seconds'] / 3600:.2f}, charged"
            f" {answer['allocated_gpu_seconds'] / 3600:.2f}, of which unallocated"
            f" {answer['unallocated_gpu_seconds'] / 3600:.2f}"
        )

    emit(output, answer, shown, [f"usage/{u['tenant']}/{u['model']}" for u in items])

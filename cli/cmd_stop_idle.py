"""`gpuctl stop-idle`: stop the replicas nobody has used for a while, once, on an operator's word,
by the same rules as scale-to-zero: never one whose use is unknown, never below min_replicas,
and each only once no router may still send it a request."""

import click

from cli.context import Context, pass_context
from cli.output import OUTPUT, emit
from cli.render import idle_text
from controlplane.vocabulary.specs import parse_duration


@click.command("stop-idle")
@click.argument("models", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Say what would stop, stop nothing.")
@click.option(
    "--idle-after",
    default=None,
    help="Unused this long (e.g. 30m); default: each model's scale_to_zero_after, else its"
    " idle_after.",
)
@OUTPUT
@pass_context
def stop_idle(ctx: Context, models, dry_run: bool, idle_after, output: str):
    """Stop the idle replicas of MODELS (default: all models) and free their GPUs."""
    body = {"dry_run": dry_run, "models": list(models)}
    if idle_after is not None:
        try:
            body["idle_after"] = parse_duration(idle_after, "idle-after")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--idle-after") from None
    answer = ctx.post("/v1/stop-idle", body)

    def human(wide: bool) -> str:
        verb = "would stop" if dry_run else "stopping"
        lines = [
            f"replica/{s['id']} ({s['model']}) {verb}: idle"
            f" {idle_text(s['idle_s'], s['idle_state'])}, {s['gpus']} GPU(s)"
            for s in answer["stopped"]
        ]
        freed = "would free" if dry_run else "frees"
        lines.append(f"{len(answer['stopped'])} replica(s) {freed} {answer['gpus_freed']} GPU(s)")
        if not dry_run and answer["stopped"]:
            lines.append("(each stops once no router may still send it a request)")
        for r in answer["refused"]:
            lines.append(f"kept replica/{r['id']} ({r['model']}): {r['why']}")
        return "\n".join(lines)

    emit(output, answer, human, [f"replica/{s['id']}" for s in answer["stopped"]])

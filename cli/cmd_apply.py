"""`gpuctl apply -f`, `delete`, `scale`: change the desired state of models and adapters."""

import sys

import click
import yaml

from cli.context import Context, pass_context
from cli.output import OUTPUT, emit


def say(output: str, answer: dict, name: str, done: str) -> None:
    """A change's answer: `kind/name done` for humans, or the API's answer."""
    emit(output, answer, lambda wide: f"{name} {done}", [name])


def read_specs(path: str) -> list:
    try:
        text = sys.stdin.read() if path == "-" else open(path).read()
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except OSError as exc:
        raise click.BadParameter(str(exc), param_hint="-f") from None
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{path}: not valid YAML: {exc}") from None
    specs = []
    for document in documents:
        # `models:` lists model specs; a tenant's `models` lists what it may call.
        if (
            isinstance(document, dict)
            and isinstance(document.get("models"), list)
            and "kind" not in document
        ):
            specs += document["models"]
        else:
            specs.append(document)
    if not specs:
        raise click.ClickException(f"{path}: no model spec found")
    return specs


@click.command("apply")
@click.option(
    "-f",
    "--filename",
    "path",
    required=True,
    help="YAML file of model specs ('-' for standard input).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Have the control plane check every spec and say what it would do; store nothing.",
)
@OUTPUT
@pass_context
def apply(ctx: Context, path: str, dry_run: bool, output: str):
    """Create or update the models and adapters in a YAML file (one spec per document, or
    `models:`); a document with `kind: adapter` is a LoRA adapter of its `base`, one with
    `kind: tenant` a tenant (who calls the routers, and its limits)."""
    results, names = [], []
    query = "?dry_run=true" if dry_run else ""
    for spec in read_specs(path):
        if isinstance(spec, dict) and spec.get("kind") == "adapter":
            answer = ctx.post("/v1/adapters" + query, spec)
            names.append(f"adapter/{answer['adapter']['name']}")
        elif isinstance(spec, dict) and spec.get("kind") == "tenant":
            answer = ctx.post("/v1/tenants" + query, spec)
            names.append(f"tenant/{answer['tenant']['name']}")
        else:
            answer = ctx.post("/v1/models" + query, spec)
            names.append(f"model/{answer['spec']['name']}")
        results.append(answer)
    suffix = " (dry run)" if dry_run else ""
    emit(
        output,
        {"items": results},
        lambda wide: "\n".join(
            f"{name} {answer['result']}{suffix}"
            + "".join(f"\n  {line}" for line in answer.get("explain", []))
            for name, answer in zip(names, results, strict=True)
        ),
        names,
    )


@click.command("delete")
@click.argument("model")
@OUTPUT
@pass_context
def delete(ctx: Context, model: str, output: str):
    """Delete MODEL (its replicas stop), `adapter/NAME` (unloaded wherever it is) or
    `tenant/NAME` (its keys are refused from the next route version)."""
    kind, _, name = model.rpartition("/")
    if kind in ("adapter", "tenant"):
        answer = ctx.delete(f"/v1/{kind}s/{name}")
        say(output, answer, f"{kind}/{answer[kind]['name']}", "deleted")
        return
    if kind not in ("", "model"):
        raise click.BadParameter(
            f"{model}: model/NAME, adapter/NAME or tenant/NAME", param_hint="MODEL"
        )
    answer = ctx.delete(f"/v1/models/{name}")
    say(output, answer, f"model/{answer['spec']['name']}", "deleted")


@click.command("scale")
@click.argument("model")
@click.argument("replicas", type=click.IntRange(min=0))
@OUTPUT
@pass_context
def scale(ctx: Context, model: str, replicas: int, output: str):
    """Set MODEL's number of REPLICAS."""
    answer = ctx.post(f"/v1/models/{model}/scale", {"replicas": replicas})
    spec = answer["spec"]
    said = f"scaled to {spec['replicas']}"
    if spec.get("target_in_flight") is not None:
        floor = spec["replicas"] if spec["min_replicas"] is None else spec["min_replicas"]
        said += (
            f" (the point it starts from: load moves it between {floor} and"
            f" {spec['max_replicas'] or spec['replicas']})"
        )
    say(output, answer, f"model/{spec['name']}", said)


def _node_action(action: str, help_text: str):
    @click.command(action, help=help_text)
    @click.argument("node")
    @OUTPUT
    @pass_context
    def command(ctx: Context, node: str, output: str):
        answer = ctx.post(f"/v1/nodes/{node}/{action}")
        say(output, answer, f"node/{answer['name']}", answer["schedulable"])

    return command


cordon = _node_action("cordon", "Place nothing new on NODE.")
uncordon = _node_action("uncordon", "Let NODE take replicas again.")
drain = _node_action("drain", "Move NODE's replicas elsewhere, then stop them there.")

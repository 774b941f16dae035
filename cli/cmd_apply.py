"""`gpuctl apply -f`, `delete`, `scale`: change the desired state of models."""

import sys

import click
import yaml

from cli.context import Context, pass_context
from cli.render import echo_json

TEXT_OR_JSON = click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)


def say(output: str, answer: dict, text: str) -> None:
    if output == "json":
        echo_json(answer)
    else:
        click.echo(text)


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
        if isinstance(document, dict) and isinstance(document.get("models"), list):
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
@TEXT_OR_JSON
@pass_context
def apply(ctx: Context, path: str, output: str):
    """Create or update the models in a YAML file (one spec per document, or `models:`)."""
    results = []
    for spec in read_specs(path):
        answer = ctx.post("/v1/models", spec)
        results.append(answer)
        if output == "text":
            click.echo(f"model/{answer['spec']['name']} {answer['result']}")
    if output == "json":
        echo_json({"items": results})


@click.command("delete")
@click.argument("model")
@TEXT_OR_JSON
@pass_context
def delete(ctx: Context, model: str, output: str):
    """Delete MODEL; its replicas are stopped."""
    answer = ctx.delete(f"/v1/models/{model}")
    say(output, answer, f"model/{answer['spec']['name']} deleted")


@click.command("scale")
@click.argument("model")
@click.argument("replicas", type=click.IntRange(min=0))
@TEXT_OR_JSON
@pass_context
def scale(ctx: Context, model: str, replicas: int, output: str):
    """Set MODEL's number of REPLICAS."""
    answer = ctx.post(f"/v1/models/{model}/scale", {"replicas": replicas})
    say(output, answer, f"model/{answer['spec']['name']} scaled to {answer['spec']['replicas']}")


def _node_action(action: str, help_text: str):
    @click.command(action, help=help_text)
    @click.argument("node")
    @TEXT_OR_JSON
    @pass_context
    def command(ctx: Context, node: str, output: str):
        answer = ctx.post(f"/v1/nodes/{node}/{action}")
        say(output, answer, f"node/{answer['name']} {answer['schedulable']}")

    return command


cordon = _node_action("cordon", "Place nothing new on NODE.")
uncordon = _node_action("uncordon", "Let NODE take replicas again.")
drain = _node_action("drain", "Move NODE's replicas elsewhere, then stop them there.")

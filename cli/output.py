"""One `-o` vocabulary for every gpuctl command, as kubectl has: table, wide, json, yaml, name.

`emit` writes an API answer in the asked-for format; a command gives it the table for humans
and the `kind/name` of each object for `-o name`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable

import click
import yaml

FORMATS = ("table", "wide", "json", "yaml", "name")

OUTPUT = click.option(
    "-o",
    "--output",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="Output format.",
)
NO_HEADERS = click.option("--no-headers", is_flag=True, help="Leave the header row out.")
WATCH = click.option(
    "-w", "--watch", is_flag=True, help="Show it again every --interval seconds until Ctrl-C."
)
INTERVAL = click.option("--interval", default=2.0, show_default=True, help="Seconds, with -w.")


def emit(
    output: str, answer, human: Callable[[bool], str], names: list[str], colour: bool = False
) -> None:
    """`colour`: the human text carries colour codes to keep (click drops them off a TTY)."""
    if output == "json":
        click.echo(json.dumps(answer, indent=2, ensure_ascii=False))
    elif output == "yaml":
        click.echo(yaml.safe_dump(answer, sort_keys=False, allow_unicode=True), nl=False)
    elif output == "name":
        for name in names:
            click.echo(name)
    else:
        click.echo(human(output == "wide"), color=colour or None)


def terminal_width() -> int:
    return shutil.get_terminal_size().columns


def use_colour(mode: str = "auto", stream=None) -> bool:
    """NO_COLOR always wins; then --color always/never; auto: only on a terminal."""
    if "NO_COLOR" in os.environ or mode == "never":
        return False
    if mode == "always":
        return True
    stream = stream or sys.stdout
    return hasattr(stream, "isatty") and stream.isatty()


def watching(show: Callable[[], None], watch: bool, interval: float) -> None:
    """`show` once, or again every `interval` seconds until Ctrl-C (a clear screen between
    two on a terminal, a blank line elsewhere)."""
    show()
    if not watch:
        return
    on_terminal = sys.stdout.isatty()
    try:
        while True:
            time.sleep(interval)
            if on_terminal:
                click.clear()
            else:
                click.echo()
            show()
    except KeyboardInterrupt:
        pass

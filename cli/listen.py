"""HOST:PORT arguments, shared by every command that listens. The parsing is the router's
(router/listen.py: the router is the lower room and imports nothing of gpuctl's)."""

import click

from router.listen import parse_listen as parse_host_port


def parse_listen(value: str) -> tuple[str, int]:
    try:
        return parse_host_port(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None

"""The object every gpuctl command receives: where the control plane is, and how to call it."""

from __future__ import annotations

from dataclasses import dataclass

import click

from cli import client
from cli.config import ClientConfig, resolve
from cli.output import use_colour


@dataclass
class Context:
    server_flag: str | None
    token_flag: str | None
    colour_mode: str = "auto"
    ca_file_flag: str | None = None
    _config: ClientConfig | None = None

    @property
    def config(self) -> ClientConfig:
        if self._config is None:
            try:
                self._config = resolve(self.server_flag, self.token_flag, self.ca_file_flag)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
        return self._config

    @property
    def colour(self) -> bool:
        return use_colour(self.colour_mode)

    def call(self, method: str, path: str, body=None):
        c = self.config
        return client.request(c.server, method, path, body, token=c.token, ca_file=c.ca_file)

    def get(self, path: str):
        return self.call("GET", path)

    def post(self, path: str, body=None):
        return self.call("POST", path, body or {})

    def delete(self, path: str):
        return self.call("DELETE", path)


pass_context = click.make_pass_decorator(Context)

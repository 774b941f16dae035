"""How gpuctl finds its control plane, the way kubectl finds its cluster.

--server/--token/--ca-file, else GPUCTL_SERVER/GPUCTL_TOKEN/GPUCTL_CA_FILE, else the client
config file
(GPUCTL_CONFIG, or config.yaml in the user's config directory, which `gpuctl up` writes),
else http://127.0.0.1:8081 with no token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from cli.paths import client_config_path

DEFAULT_SERVER = "http://127.0.0.1:8081"
DEFAULT_SIM_ADMIN = "http://127.0.0.1:8082"


@dataclass
class ClientConfig:
    server: str = DEFAULT_SERVER
    token: str | None = None
    sim_admin: str = DEFAULT_SIM_ADMIN
    ca_file: str | None = None  # the CA that signed an https:// control plane's certificate


def config_file() -> Path:
    return Path(os.environ.get("GPUCTL_CONFIG") or client_config_path())


def read_config_file() -> dict:
    path = config_file()
    try:
        loaded = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping with server and token")
    return loaded


def resolve(server: str | None, token: str | None, ca_file: str | None = None) -> ClientConfig:
    stored = read_config_file()
    return ClientConfig(
        ca_file=ca_file or os.environ.get("GPUCTL_CA_FILE") or stored.get("ca_file"),
        server=(
            server or os.environ.get("GPUCTL_SERVER") or stored.get("server") or DEFAULT_SERVER
        ).rstrip("/"),
        token=token or os.environ.get("GPUCTL_TOKEN") or stored.get("token"),
        sim_admin=(
            os.environ.get("GPUCTL_SIM_ADMIN") or stored.get("sim_admin") or DEFAULT_SIM_ADMIN
        ).rstrip("/"),
    )


def write_config(
    server: str, token: str | None, sim_admin: str | None, ca_file: str | None = None
) -> Path:
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"server": server, "token": token, "sim_admin": sim_admin, "ca_file": ca_file}
    path.write_text(yaml.safe_dump({k: v for k, v in body.items() if v}))
    path.chmod(0o600)
    return path

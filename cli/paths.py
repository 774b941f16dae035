"""Where gpufleet keeps its files by default (XDG directories)."""

import os
from pathlib import Path


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpufleet"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpufleet"


def default_state_path() -> Path:
    return state_dir() / "controlplane.sqlite"


def client_config_path() -> Path:
    return config_dir() / "config.yaml"

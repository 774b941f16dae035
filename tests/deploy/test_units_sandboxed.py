"""Each unit in deploy/systemd run as systemd would run it, and the three serving a request.

systemd is not this machine's init, so its sandbox is built by hand, as close as the machine
allows: the unit's ExecStart with its specifiers and its environment file expanded; a uid of
its own that owns nothing else (DynamicUser=); `/` read-only but for the unit's state and cache
directories (ProtectSystem=strict); nothing of root's home (ProtectHome=), but the Python the
virtual environment runs on; and each secret root-owned with mode 0600 under the test's
/etc/gpufleet, handed over as LoadCredential= does: copied into a credentials directory only
that uid can read, named by $CREDENTIALS_DIRECTORY. A unit that read a secret by path, wrote
outside its directories or relied on root would fail here as under systemd.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import openai
import pytest
import yaml

from tests.controlplane.conftest import spec
from tests.harness import BIN, call, free_port, get, wait_for_port, wait_until

pytestmark = pytest.mark.integration
UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED_BIN = "/opt/gpufleet/bin/"
TOKENS = {"admin": "adm-unit", "agent": "agt-unit", "router": "rtr-unit"}
FIRST_DYNAMIC_UID = 61_200  # systemd hands dynamic users out of 61184-65519
FLEET = {"fabrics": [{"name": "f", "nodes": 1, "gpu_class": "H100-80GB", "gpus_per_node": 1}]}


def unit_settings(unit: Path) -> dict[str, list[str]]:
    """[Service] settings, each name to its values in order."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in unit.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            name, _, value = line.partition("=")
            settings.setdefault(name.strip(), []).append(value.strip())
    return settings


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (line.partition("=") for line in path.read_text().splitlines())
    return {k.strip(): v.strip() for k, _, v in pairs if k.strip() and not k.startswith("#")}


def command_line(exec_start: str, env: dict[str, str], specifiers: dict[str, str]) -> list[str]:
    """ExecStart as systemd reads it: %-specifiers, then ${VAR} as one word, $VAR split."""
    for letter, value in specifiers.items():
        exec_start = exec_start.replace(f"%{letter}", value)
    words = []
    for word in shlex.split(exec_start):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            words += env.get(whole.group(1), "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env[m.group(1)], word))
    return [words[0].replace(INSTALLED_BIN, f"{BIN}/"), *words[1:]]


def private(path: Path, uid: int, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)
    path.chmod(mode)
    return path


class SandboxedUnit:
    """One unit's ExecStart in a sandbox of its own (see the module's docstring)."""

    def __init__(self, root: Path, name: str, uid: int, env_file: dict[str, str]) -> None:
        settings = unit_settings(UNITS / f"{name}.service")
        self.root, self.name, self.uid = root, name, uid
        var = root / "var"
        credentials = private(root / "run" / "credentials" / name, uid, 0o500)
        for entry in settings.get("SetCredential", []):  # defaults first, loaded files over them
            credential, _, value = entry.partition(":")
            (credentials / credential).write_text(value)
        for entry in settings.get("LoadCredential", []):
            credential, _, source = entry.partition(":")
            where = root / source.lstrip("/")
            if where.exists():
                shutil.copyfile(where, credentials / credential)
        for handed in credentials.iterdir():
            os.chown(handed, uid, uid)
            handed.chmod(0o400)
        writable = []
        state = cache = None
        for directory in settings.get("StateDirectory", []):
            state = private(var / "lib" / directory, uid, 0o700)
            writable.append(state)
        for directory in settings.get("CacheDirectory", []):
            cache = private(var / "cache" / directory, uid, 0o700)
            writable.append(cache)
        tmp = private(root / "tmp" / name, uid, 0o700)  # PrivateTmp=
        writable.append(tmp)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/",  # a dynamic user's
            "LANG": "C.UTF-8",
            "TMPDIR": str(tmp),
            "CREDENTIALS_DIRECTORY": str(credentials),
            **({"STATE_DIRECTORY": str(state)} if state else {}),
            **({"CACHE_DIRECTORY": str(cache)} if cache else {}),
            **env_file,
        }
        argv = command_line(
            settings["ExecStart"][0],
            env,
            {"S": str(var / "lib"), "C": str(var / "cache"), "d": str(credentials)},
        )
        self.argv = argv
        self.log = root / f"{name}.log"
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             sandbox_script(writable, uid, env, argv)],
            stdout=open(self.log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


def sandbox_script(writable: list[Path], uid: int, env: dict, argv: list[str]) -> str:
    """Run as root in a mount namespace of its own, then as `uid` for good."""
    lines = ["set -e"]
    lines += [f"mount --bind {shlex.quote(str(d))} {shlex.quote(str(d))}" for d in writable]
    interpreter = Path(sys.base_prefix).resolve()
    hidden = Path("/root")
    if hidden in interpreter.parents:
        # ProtectHome=yes: root's home is gone, but the Python installed under it is kept
        # (on a real host the virtual environment is under /opt).
        top = hidden / interpreter.relative_to(hidden).parts[0]
        lines += [
            f"mkdir -p {TOOLS}",
            f"mount --bind {shlex.quote(str(top))} {TOOLS}",
            f"mount -t tmpfs -o mode=0755,size=1m tmpfs {hidden}",
            f"mkdir {shlex.quote(str(top))}",
            f"mount --bind {TOOLS} {shlex.quote(str(top))}",
        ]
    lines.append("mount -o remount,bind,ro /")
    variables = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    lines.append(
        f"exec setpriv --reuid={uid} --regid={uid} --clear-groups --no-new-privs"
        f" --inh-caps=-all env -i {variables} {shlex.join(argv)}"
    )
    return "\n".join(lines)


TOOLS = "/mnt"  # an empty directory of the host's, where the interpreter is held a moment


@pytest.mark.skipif(os.geteuid() != 0, reason="making a sandbox's mounts and uids needs root")
def test_each_unit_serves_in_its_sandbox_with_its_secrets_as_credentials():
    # Not under pytest's tmp_path: its parents are root's alone, and the units' users must
    # reach their directories and credentials as they would under /var/lib and /run.
    with tempfile.TemporaryDirectory(prefix="gpufleet-units-") as scratch:
        os.chmod(scratch, 0o755)
        serve_a_request_through_the_units(Path(scratch))


def serve_a_request_through_the_units(root: Path) -> None:
    etc = root / "etc" / "gpufleet"
    etc.mkdir(parents=True)
    secrets = {
        "tokens.yaml": yaml.safe_dump(TOKENS),
        "agent-token": TOKENS["agent"],
        "router-token": TOKENS["router"],
    }
    for name, text in secrets.items():
        (etc / name).write_text(text)
        (etc / name).chmod(0o600)  # root's alone, as the docs ask
    fleet = etc / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(FLEET))
    fleet.chmod(0o644)
    for level in (root / "etc", etc):
        level.chmod(0o755)
    server_port, router_port = free_port(), free_port()
    server_url = f"http://127.0.0.1:{server_port}"
    state = root / "var" / "lib" / "gpufleet"
    envs = {
        "gpuctl-server": {
            **read_env_file(UNITS / "gpuctl-server.env"),
            "GPUFLEET_LISTEN": f"127.0.0.1:{server_port}",
            "GPUFLEET_STATE": str(state / "controlplane.sqlite"),
        },
        "gpuctl-agent": {
            **read_env_file(UNITS / "gpuctl-agent.env"),
            "GPUFLEET_SERVERS": server_url,
            "GPUFLEET_AGENT_ARGS": f"--simulate {fleet} --heartbeat 0.5",
        },
        "gpurouter": {
            **read_env_file(UNITS / "gpurouter.env"),
            "GPUROUTER_LISTEN": f"127.0.0.1:{router_port}",
            "GPUFLEET_SERVERS": server_url,
            "GPUROUTER_ARGS": "--workers 2 --tick 0.5",
        },
    }
    # The sample's secrets must not be in its environment files: the units hand them over.
    assert not any("token" in v for e in envs.values() for v in e.values()), envs
    units: list[SandboxedUnit] = []
    try:
        for index, name in enumerate(envs):
            units.append(SandboxedUnit(root, name, FIRST_DYNAMIC_UID + index, envs[name]))
            if name == "gpuctl-server":
                wait_for_port(server_port, units[-1].proc, 30)
        wait_for_port(router_port, units[-1].proc, 30)
        admin = TOKENS["admin"]
        wait_until(
            lambda: call("GET", f"{server_url}/v1/nodes", token=admin)[1].get("items"),
            30,
            "the agent's node, registered with the token it was handed",
        )
        body = spec(name="chat", command=["gpuctl", "sim-engine", "--port", "{port}",
                                          "--model", "{model}"])  # fmt: skip
        status, answer = call("POST", f"{server_url}/v1/models", body, admin)
        assert status in (200, 201), answer
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{router_port}/v1", api_key="-",
                            max_retries=0, timeout=60)  # fmt: skip
        reply = api.chat.completions.create(model="chat", messages=[])
        assert reply.choices[0].message.content
        # Each ran as its own user; the engine got a home and a cache it could write.
        for unit in units:
            assert os.stat(f"/proc/{unit.proc.pid}").st_uid == unit.uid, unit.name
        records = list((root / "var" / "lib" / "gpufleet-agent").glob("nodes/*/replicas/*.json"))
        engine = json.loads(records[0].read_text())["pid"]
        engine_env = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{engine}/environ").read_text().split("\0")
            if "=" in item
        )
        assert engine_env["HOME"].startswith(str(root / "var" / "lib" / "gpufleet-agent"))
        cache = root / "var" / "cache" / "gpufleet-agent"
        assert engine_env["HF_HOME"] == str(cache / "huggingface")
        assert "NOTIFY_SOCKET" not in engine_env and "CREDENTIALS_DIRECTORY" not in engine_env
        status, _ = get(f"{server_url}/v1/nodes")
        assert status == 401, "the server took its tokens from its credentials"
    except Exception:
        for unit in units:
            print(f"--- {unit.name}: {unit.argv}\n{unit.output()[-3000:]}")
        raise
    finally:
        for unit in reversed(units):
            unit.stop()

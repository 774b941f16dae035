"""`gpuctl up`: a whole fleet on this machine, from one command, until Ctrl-C.

It starts the control plane, an agent (real GPUs when NVML finds any, else a simulated fleet)
and a router, each a separate process in its own session; writes the client config so that
`gpuctl status` in another terminal just works; applies demo models; restarts a part that
dies; and on Ctrl-C, SIGTERM or SIGHUP stops everything it started, router first, whatever
became of its output (a pipe whose reader died with the same Ctrl-C, a closed terminal). A
second signal cuts the stop's waits short.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import click

from cli import client
from cli.config import write_config
from cli.tls import make_certificates
from controlplane.agent.processes import cmdline, process_alive, same_program
from controlplane.api.tokens import load_tokens, write_tokens
from controlplane.state.store import without_password

DEMO_COMMAND = [
    "gpuctl",
    "sim-engine",
    "--port",
    "{port}",
    "--model",
    "{model}",
    "--ttft",
    "0.05",
    "--tokens-per-s",
    "200",
    "--output-tokens",
    "32",
]
RESTARTS_PER_MINUTE = 5
STOP_GRACE_S = 20  # what a part is given to stop on SIGTERM before it is killed


def demo_models(
    gpu_classes: list[str], nodes: list[dict] | None = None, engine_flags: tuple[str, ...] = ()
) -> list[dict]:
    """Two models that fit, a small one packed on a card beside the first, and a fourth that
    fits only on the cards of the second: more models than cards, swapped on request
    (min_replicas 0, a short min_residency). `engine_flags`: added to each engine's command."""
    command = DEMO_COMMAND + list(engine_flags)
    first = gpu_classes[0]
    second = gpu_classes[1] if len(gpu_classes) > 1 else first
    sizes = [n["gpus_by_class"][second]["total"] for n in nodes or [] if second in n["gpu_classes"]]
    # Whole nodes of the second class, as many as there are (at most 2): the second model's
    # replica sits on one of them, so the third is placed only by taking its GPUs.
    big = {"gpus_per_replica": min(sizes), "nodes_per_replica": min(len(sizes), 2)} if sizes else {}
    models = [
        {
            "name": "llama-3.1-8b",
            "gpu_class": first,
            "replicas": 2,
            "gpus_per_replica": 1,
            "command": command,
            "idle_after": "30m",
            # 16 GB of weights and KV cache on top: it shares its card with what else fits.
            "gpu_memory": "24GB",
        },
        {
            "name": "qwen2.5-1.5b",
            "gpu_class": first,
            "replicas": 1,
            "gpus_per_replica": 1,
            "command": command,
            "idle_after": "30m",
            "gpu_memory": "10GB",  # packed beside a llama-3.1-8b, awake on the same card
        },
        {
            "name": "qwen2.5-7b",
            "gpu_class": second,
            "replicas": 1,
            "gpus_per_replica": 2,
            "command": command,
            "idle_after": "30m",
            "min_replicas": 0,
            "scale_to_zero_after": "30m",
            "min_residency": "30s",
            # Its sim engines sleep as vLLM's do: idle 5 minutes, it sleeps on its cards, and
            # a request wakes it in a fraction of a second instead of a cold start.
            "engine": "vllm",
            "sleep": {"level": 1, "after": "5m"},
        },
    ]
    if big and big["gpus_per_replica"] >= 2:
        models.append(
            {
                "name": "llama-3.1-405b",
                "gpu_class": second,
                "replicas": 1,
                "min_replicas": 0,
                "scale_to_zero_after": "10m",
                # Short enough for a tour: a request for qwen after it takes qwen's cards
                # back half a minute on, not the server's 2 minutes.
                "min_residency": "30s",
                "command": command,
                "idle_after": "30m",
                **big,
            }
        )
    return models


def program(name: str) -> list[str]:
    """How to run one of our own commands: the script beside this Python, else -m."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", {"gpuctl": "cli", "gpurouter": "router"}[name]]


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Console:
    """`click.echo` that outlives its reader. Once a stream's reader is gone (a pipe's reader
    killed by the same Ctrl-C, a closed terminal: EPIPE or EIO), its further lines are dropped
    instead of raised, so that no message can cut a stop short; the stream is pointed at
    /dev/null, so that Python's last flush at exit does not fail either."""

    def __init__(self, echo=click.echo) -> None:
        self._echo = echo
        self.gone: set[bool] = set()  # err=False (stdout) and/or err=True (stderr)

    def __call__(self, message=None, nl: bool = True, err: bool = False) -> None:
        if err in self.gone:
            return
        try:
            self._echo(message, nl=nl, err=err)
        except OSError:
            self.gone.add(err)
            stream = sys.stderr if err else sys.stdout
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass


class AskedToStop(Exception):
    """Ctrl-C (or SIGTERM) came while `gpuctl up` was still starting: stop now."""


def wait_http(url: str, timeout: float, proc: subprocess.Popen, ca_file=None,
              stopping=lambda: False) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout
    tls = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    while time.monotonic() < deadline:
        if stopping():
            raise AskedToStop
        if proc.poll() is not None:
            raise click.ClickException(f"it exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1, context=tls):
                return
        except OSError:
            time.sleep(0.1)
    raise click.ClickException(f"{url} did not answer within {timeout:.0f}s")


@dataclass
class Part:
    name: str
    argv: list[str]
    health_url: str
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)
    next_start: float = 0.0  # when a part that died is started again (0: running)


class FleetUp:
    def __init__(
        self,
        workdir: Path,
        server_listen,
        router_listen,
        admin_listen,
        simulate: bool | None,
        fleet_file: str | None,
        tick_s: float,
        echo,
        tls: bool = False,
        state: str | None = None,
        otlp_endpoint: str | None = None,
        trace_sample: float = 0.01,
    ) -> None:
        self.dir = workdir.resolve()
        # A SQLite file in the fleet's directory, or a postgresql:// URL
        self.state = state or str(self.dir / "state.sqlite")
        self.logs = self.dir / "logs"
        self.pids = self.dir / "pids"
        self.tls = tls
        self.ca_file: str | None = None  # set on start, with --tls
        scheme = "https" if tls else "http"
        self.server_url = f"{scheme}://{server_listen[0]}:{server_listen[1]}"
        self.router_url = f"http://{router_listen[0]}:{router_listen[1]}"
        self.admin_url = f"http://{admin_listen[0]}:{admin_listen[1]}"
        self.listens = {
            "control plane": server_listen,
            "router": router_listen,
            "fault injection": admin_listen,
        }
        self.simulate = simulate
        self.fleet_file = fleet_file
        self.tick_s = tick_s
        # Traces of every part (the server's decisions, the router's requests, the demo
        # engines continuing them) to this OTLP/HTTP collector, or none.
        self.otlp_endpoint = otlp_endpoint
        self.trace_sample = trace_sample
        self.echo = echo
        self.parts: list[Part] = []
        self.stopping = False
        self.hurry = False  # a second signal: stop without waiting for anything to stop cleanly
        self.example_gpu: tuple[str, int] | None = None  # a GPU of this fleet, for the banner

    def traced(self, flag: str) -> tuple[str, ...]:
        """`flag URL` when traces are on, else nothing."""
        return (flag, self.otlp_endpoint) if self.otlp_endpoint else ()

    # start

    def pause(self, seconds: float) -> None:
        """A wait while starting that Ctrl-C ends at once."""
        if self.stopping:
            raise AskedToStop
        time.sleep(seconds)
        if self.stopping:
            raise AskedToStop

    def start(self) -> None:
        for directory in (self.dir, self.logs, self.pids):
            directory.mkdir(parents=True, exist_ok=True)
        self.stop_leftovers()
        busy = [
            f"{what} ({host}:{port})"
            for what, (host, port) in self.listens.items()
            if not port_is_free(host, port)
        ]
        if busy:
            raise click.ClickException(
                "already in use: " + ", ".join(busy) + " (another gpuctl up? pick other ports with "
                "--server-listen/--router-listen/--sim-admin-listen)"
            )
        token_file = self.dir / "tokens.yaml"
        tokens = load_tokens(token_file) if token_file.exists() else write_tokens(token_file)
        self.admin_token = tokens["admin"]
        server_tls, client_tls = [], []
        if self.tls:
            made = make_certificates(self.dir / "tls", (self.listens["control plane"][0],))
            self.ca_file = str(made.ca)
            server_tls = ["--tls-cert", str(made.cert), "--tls-key", str(made.key)]
            client_tls = ["--ca-file", self.ca_file]
        simulate = self.simulate
        if simulate is None:
            from controlplane.agent.nvml import load_nvml

            simulate = load_nvml() is None
        self.simulated = simulate
        gpuctl, gpurouter = program("gpuctl"), program("gpurouter")
        server_host, server_port = self.listens["control plane"]
        self.parts = [
            Part(
                "control plane",
                [
                    *gpuctl,
                    "server",
                    "--listen",
                    f"{server_host}:{server_port}",
                    "--state",
                    self.state,
                    "--token-file",
                    str(token_file),
                    "--node-timeout",
                    "10",
                    "--heartbeat",
                    "1",
                    *server_tls,
                    *self.traced("--otlp-endpoint"),
                ],
                # 200 once it leads: at once on SQLite, after its election on PostgreSQL
                self.server_url + "/v1/leader",
            ),
            Part(
                "agent",
                [
                    *gpuctl,
                    "agent",
                    "--server",
                    self.server_url,
                    *client_tls,
                    "--token-file",
                    str(token_file),
                    "--state-dir",
                    str(self.dir / "agent"),
                    "--heartbeat",
                    "1",
                    "--stop-grace",
                    "10",
                    *(
                        [
                            "--simulate",
                            self.fleet_file or "-",
                            "--sim-admin",
                            "{}:{}".format(*self.listens["fault injection"]),
                        ]
                        if simulate
                        else ["--stop-replicas-on-exit"]
                    ),
                ],
                self.admin_url + "/nodes" if simulate else "",
            ),
            Part(
                "router",
                [
                    *gpurouter,
                    "--listen",
                    "{}:{}".format(*self.listens["router"]),
                    "--control-plane",
                    self.server_url,
                    *client_tls,
                    "--token-file",
                    str(token_file),
                    "--tick",
                    str(self.tick_s),
                    *self.traced("--otlp-endpoint"),
                    *(["--trace-sample", str(self.trace_sample)] if self.otlp_endpoint else []),
                ],
                self.router_url + "/healthz",
            ),
        ]
        for part in self.parts:
            self.echo(f"  starting {part.name:<14}", nl=False)
            self.launch(part)
            if part.health_url:
                try:
                    tls = self.ca_file if part.health_url.startswith("https") else None
                    wait_http(part.health_url, 30, part.proc, tls, lambda: self.stopping)
                except click.ClickException as exc:
                    self.echo("failed")
                    raise click.ClickException(
                        f"the {part.name} did not start: {exc.message}; see "
                        f"{self.logs / self.log_name(part)}"
                    ) from None
            self.echo(f"ok   pid {part.proc.pid}")
        write_config(
            self.server_url, self.admin_token, self.admin_url if simulate else None, self.ca_file
        )

    def log_name(self, part: Part) -> str:
        return part.name.replace(" ", "-") + ".log"

    def launch(self, part: Part) -> None:
        log = open(self.logs / self.log_name(part), "ab")
        part.proc = subprocess.Popen(
            part.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        # NAME.pid holds the pid alone, for `kill $(cat ...)`; NAME.json the command too, so
        # that a later `gpuctl up` stops only what is still the same program.
        # Each is written whole under its final name, so `cat` never reads half a number.
        name = part.name.replace(" ", "-")
        record = json.dumps({"pid": part.proc.pid, "argv": part.argv})
        replace_file(self.pids / f"{name}.json", record)
        replace_file(self.pids / f"{name}.pid", f"{part.proc.pid}\n")

    def kill_engines(self) -> None:
        """The engines the agent recorded, killed: after a hurried stop the agent may have had
        no time to stop them itself (each runs in a session of its own)."""
        for record in (self.dir / "agent" / "nodes").glob("*/replicas/*.json"):
            try:
                running = json.loads(record.read_text())
                pid, argv = int(running["pid"]), list(running["argv"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if process_alive(pid) and same_program(cmdline(pid), argv):
                os.kill(pid, signal.SIGKILL)

    def stop_leftovers(self) -> None:
        """Stop what an earlier `gpuctl up` in this folder left running when it was killed
        (kill -9 gives it no chance to stop its parts): each part it recorded, if that pid
        still runs the same command, is stopped as at Ctrl-C (the agent stops its engines)."""
        for pid_file in sorted(self.pids.glob("*.json")):
            try:
                record = json.loads(pid_file.read_text())
                pid, argv = int(record["pid"]), list(record["argv"])
            except (OSError, ValueError, KeyError, TypeError):
                pid_file.unlink(missing_ok=True)
                continue
            if process_alive(pid) and same_program(cmdline(pid), argv):
                self.echo(f"  stopping what an earlier gpuctl up left running (pid {pid})")
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 20
                while process_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if process_alive(pid):
                    os.kill(pid, signal.SIGKILL)
            pid_file.unlink(missing_ok=True)
            pid_file.with_suffix(".pid").unlink(missing_ok=True)

    # demo

    def apply_demo(self, timeout_s: float = 90.0) -> list[str]:
        deadline = time.monotonic() + 30
        while True:
            nodes = client.request(
                self.server_url, "GET", "/v1/nodes", token=self.admin_token, ca_file=self.ca_file
            )["items"]
            if nodes or time.monotonic() > deadline:
                break
            self.pause(0.2)
        classes = sorted({c for n in nodes for c in n["gpu_classes"]})
        with_gpus = [n for n in nodes if n["gpus"]["total"]]
        if with_gpus:
            # The last card of the last node: the demo models are placed on the fullest first.
            self.example_gpu = (with_gpus[-1]["name"], with_gpus[-1]["gpus"]["total"] - 1)
        if not classes:
            self.echo("  no GPU registered: skipping the demo models")
            return []
        existing = {
            m["name"]
            for m in client.request(
                self.server_url, "GET", "/v1/models", token=self.admin_token, ca_file=self.ca_file
            )["items"]
        }
        names = []
        for spec in demo_models(classes, nodes, self.traced("--otlp-traces-endpoint")):
            names.append(spec["name"])
            if spec["name"] not in existing:
                client.request(
                    self.server_url,
                    "POST",
                    "/v1/models",
                    spec,
                    token=self.admin_token,
                    ca_file=self.ca_file,
                )
                across = spec.get("nodes_per_replica", 1)
                self.echo(
                    f"  applied model {spec['name']} ({spec['replicas']} x "
                    f"{spec['gpus_per_replica']} {spec['gpu_class']}"
                    + (f" on each of {across} nodes" if across > 1 else "")
                    + ")"
                )
        self.echo("  waiting for replicas ", nl=False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            models = client.request(
                self.server_url, "GET", "/v1/models", token=self.admin_token, ca_file=self.ca_file
            )["items"]
            ready = {m["name"]: m["ready"] >= m["desired"] for m in models}
            if all(ready.get(name) for name in names):
                self.echo(" ready")
                return names
            self.echo(".", nl=False)
            self.pause(0.5)
        self.echo(" still starting (see gpuctl replicas)")
        return names

    def banner(self, models: list[str]) -> str:
        model = models[0] if models else "MODEL"
        lines = [
            "",
            "gpufleet is up" + (" on a simulated fleet" if self.simulated else ""),
            f"  router         {self.router_url}   (OpenAI-compatible: {self.router_url}/v1)",
            f"  control plane  {self.server_url}",
            f"  state          {without_password(self.state)}",
            f"  logs           {self.logs}",
            "",
            "Try, in another terminal:",
            "  gpuctl status",
            f"  curl -s {self.router_url}/v1/chat/completions -H 'Content-Type: "
            f"application/json' \\",
            f'    -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}}\'',
            f"  python -c \"import openai; c = openai.OpenAI(base_url='{self.router_url}/v1', "
            f"api_key='-'); print(c.models.list())\"",
            "  gpuctl replicas          # IDLE: -, 12m, or ≥1h (a lower bound)",
        ]
        if self.simulated and self.example_gpu:
            node, index = self.example_gpu
            lines.append(f"  gpuctl sim gpu-fail {node} {index}   # and watch gpuctl status")
        lines += ["", "Ctrl-C stops everything."]
        return "\n".join(lines)

    # run

    def supervise(self) -> int:
        """Restart a part that dies until asked to stop: at once a few times a minute, then
        after a pause that doubles (at most a minute). The other parts stay up meanwhile."""
        while not self.stopping:
            now = time.monotonic()
            for part in self.parts:
                if self.stopping or part.proc.poll() is None:
                    continue
                if not part.next_start:
                    part.next_start = now + self.pause_before_restart(part, now)
                if now >= part.next_start:
                    part.next_start = 0.0
                    self.launch(part)
            time.sleep(0.3)
        return 0

    def pause_before_restart(self, part: Part, now: float) -> float:
        code = part.proc.returncode
        part.restarts = [t for t in part.restarts if now - t < 60] + [now]
        quick = len(part.restarts) - RESTARTS_PER_MINUTE
        if quick <= 0:
            self.echo(f"the {part.name} exited with code {code}; restarting it", err=True)
            return 0.0
        pause = min(60.0, 2.0**quick)
        self.echo(
            f"the {part.name} keeps exiting (code {code}); next try in {pause:.0f} s, the rest of"
            f" the fleet stays up; see {self.logs / self.log_name(part)}",
            err=True,
        )
        return pause

    def stop(self) -> None:
        """The router and the agent together (each says goodbye to the control plane, which
        is still there), then the control plane: Ctrl-C ends the fleet in a few seconds."""
        self.stopping = True
        running = [p for p in reversed(self.parts) if p.proc is not None and p.proc.poll() is None]
        for wave in (running[:-1], running[-1:]):
            for part in wave:
                self.echo(f"  stopping {part.name}")
                part.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for part in wave:
                while part.proc.poll() is None and not self.hurry and time.monotonic() < deadline:
                    time.sleep(0.05)
                if part.proc.poll() is None:
                    part.proc.kill()
                    part.proc.wait()
        if self.hurry:
            self.kill_engines()
        for pid_file in [*self.pids.glob("*.pid"), *self.pids.glob("*.json")]:
            pid_file.unlink(missing_ok=True)


def replace_file(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.new")
    staging.write_text(text)
    os.replace(staging, path)

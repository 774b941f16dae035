"""Start the real gpufleet processes on loopback ports for a test, and always stop them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


_HANDED_OUT: set[int] = set()


def _workers_share() -> tuple[int, int]:
    """(this pytest-xdist worker's number, how many there are); (0, 1) outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return (int(worker[2:]) if worker.startswith("gw") else 0), max(count, 1)


def free_port() -> int:
    """A loopback port nothing listens on, never one this run handed out before: the kernel
    may give a port just closed to the next bind, and two servers told the same port collide.
    Each worker of a parallel run takes only its share of the ports (by port // 2, since Linux
    hands bind() even ports where it can): two workers handed the same port had a server
    answer the other worker's test (a 404 from a control plane's route)."""
    worker, workers = _workers_share()
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port // 2 % workers == worker and port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout}s")


def wait_until(predicate, timeout: float = 20.0, what: str = "condition"):
    """Poll `predicate` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def get(url: str, headers: dict | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(url: str, body: bytes, headers: dict | None = None, timeout: float = 10.0):
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


class Processes:
    """The processes one test started; `stop_all` ends each by its PID."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[subprocess.Popen] = []

    def start(
        self, argv: list[str], port: int | None = None, env: dict | None = None, name: str = "proc"
    ) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}-{len(self.started)}.log", "wb")
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )
        proc.log_path = log.name
        self.started.append(proc)
        if port is not None:
            try:
                wait_for_port(port, proc)
            except Exception:
                raise RuntimeError(f"{argv} failed to start:\n{self.log(proc)}") from None
        return proc

    def log(self, proc) -> str:
        return Path(proc.log_path).read_text(errors="replace")[-4000:]

    def engine(self, *models: str, **flags) -> str:
        port = free_port()
        argv = ["gpuctl", "sim-engine", "--port", str(port)]
        for model in models:
            argv += ["--model", model]
        for flag, value in flags.items():
            option = "--" + flag.replace("_", "-")
            argv += [option] if value is True else [option, str(value)]
        self.start(argv, port, name="engine")
        return f"http://127.0.0.1:{port}"

    def router(self, *args: str, port: int | None = None, env: dict | None = None):
        port = port or free_port()
        proc = self.start(
            ["gpurouter", "--listen", f"127.0.0.1:{port}", *args], port, env=env, name="router"
        )
        return f"http://127.0.0.1:{port}", proc

    @staticmethod
    def terminate(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 10.0) -> int:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            self.terminate(proc, timeout=5.0)


def control_plane(
    procs: Processes,
    state: Path,
    token_file: Path | None = None,
    *extra: str,
    port: int | None = None,
    env: dict | None = None,
) -> tuple[str, subprocess.Popen]:
    port = port or free_port()
    argv = ["gpuctl", "server", "--listen", f"127.0.0.1:{port}", "--state", str(state), *extra]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    proc = procs.start(argv, port, env=env, name="server")
    return f"http://127.0.0.1:{port}", proc


def call(method: str, url: str, body=None, token: str | None = None, timeout: float = 10.0):
    """(status, decoded JSON) of one control-plane API call."""
    import json

    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")

"""The service files in deploy/systemd as systemd reads them, and each process's readiness
as systemd hears it (Type=notify): READY=1 only once its port answers (the agent's once its
nodes are registered), STOPPING=1 on SIGTERM, WATCHDOG=1 from the event loop."""

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from controlplane.vocabulary import sdnotify as cp_sdnotify
from router import sdnotify as router_sdnotify
from tests.harness import BIN, free_port, get

pytestmark = pytest.mark.integration
UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED_BIN = "/opt/gpufleet/bin/"  # where the units say the venv is


def test_each_unit_passes_systemd_analyze_verify(tmp_path):
    units = sorted(UNITS.glob("*.service"))
    assert [u.name for u in units] == [
        "gpuctl-agent.service", "gpuctl-server.service", "gpurouter.service",
    ]  # fmt: skip
    for unit in units:
        text = unit.read_text()
        assert "Type=notify" in text and "NoNewPrivileges=yes" in text, unit.name
        assert "ProtectSystem=strict" in text and "Restart=on-failure" in text, unit.name
        assert (UNITS / unit.name.replace(".service", ".env")).exists(), unit.name
        # As installed: the venv's binaries where the unit names them.
        (tmp_path / unit.name).write_text(text.replace(INSTALLED_BIN, f"{BIN}/"))
    done = subprocess.run(
        ["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


class NotifySocket:
    """The socket systemd would listen on, as NOTIFY_SOCKET names it."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "notify.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.2)

    def collect(self, seconds: float, until=lambda message: False) -> list[str]:
        """Every message for `seconds`, or up to the first for which `until` is true."""
        got: list[str] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (got and until(got[-1])):
            try:
                got.append(self.sock.recv(4096).decode())
            except TimeoutError:
                pass
        return got

    def messages(self, until: float) -> list[str]:
        got = []
        while time.monotonic() < until:
            try:
                got.append(self.sock.recv(4096).decode())
            except TimeoutError:
                if got:
                    return got
        return got

    def close(self) -> None:
        self.sock.close()


def started_with_notify(tmp_path, argv: list[str], port: int):
    listener = NotifySocket(tmp_path)
    env = {**os.environ, "NOTIFY_SOCKET": str(listener.path), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "process.log", "wb")
    proc = subprocess.Popen([str(BIN / argv[0]), *argv[1:]], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    return proc, listener


@pytest.mark.parametrize("which", ["server", "agent", "router"])
def test_ready_comes_once_the_port_answers_and_stopping_on_sigterm(tmp_path, procs, which):
    port = free_port()
    if which == "server":
        argv = ["gpuctl", "server", "--listen", f"127.0.0.1:{port}",
                "--state", str(tmp_path / "state.sqlite")]  # fmt: skip
    elif which == "agent":
        server = free_port()
        procs.start(["gpuctl", "server", "--listen", f"127.0.0.1:{server}",
                     "--state", str(tmp_path / "cp.sqlite")], server, name="server")  # fmt: skip
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text("fabrics: [{name: f, nodes: 1, gpu_class: H100-80GB, gpus_per_node: 1}]")
        argv = ["gpuctl", "agent", "--server", f"http://127.0.0.1:{server}", "--simulate",
                str(fleet), "--state-dir", str(tmp_path / "agent"),
                "--sim-admin", f"127.0.0.1:{port}"]  # fmt: skip
    else:
        argv = ["gpurouter", "--listen", f"127.0.0.1:{port}", "--backend",
                "m=http://127.0.0.1:1"]  # fmt: skip
    proc, notify = started_with_notify(tmp_path, argv, port)
    try:
        ready = notify.collect(30, until=lambda m: "READY=1" in m.splitlines())
        assert ready and "READY=1" in ready[-1].splitlines(), ready
        # Its port answered before it said so: the first connect now finds it.
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        proc.send_signal(signal.SIGTERM)
        stopping = notify.messages(time.monotonic() + 10)
        assert any("STOPPING=1" in m.splitlines() for m in stopping), stopping
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()


def test_the_agent_is_ready_only_once_its_node_is_registered(tmp_path, procs):
    """Started before its control plane: no READY=1 but a STATUS= that says why, until the
    control plane answers; then READY=1, with the node already listed."""
    server = free_port()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("fabrics: [{name: f, nodes: 1, gpu_class: H100-80GB, gpus_per_node: 1}]")
    argv = ["gpuctl", "agent", "--server", f"http://127.0.0.1:{server}", "--simulate",
            str(fleet), "--state-dir", str(tmp_path / "agent")]  # fmt: skip
    proc, notify = started_with_notify(tmp_path, argv, 0)
    try:
        early = notify.collect(4)
        assert not any("READY=1" in m.splitlines() for m in early), early
        assert any("0 of 1 node(s)" in m and "registration failed" in m for m in early), early
        procs.start(["gpuctl", "server", "--listen", f"127.0.0.1:{server}",
                     "--state", str(tmp_path / "cp.sqlite")], server, name="server")  # fmt: skip
        ready = notify.collect(30, until=lambda m: "READY=1" in m.splitlines())
        assert ready and "READY=1" in ready[-1].splitlines(), ready
        status, body = get(f"http://127.0.0.1:{server}/v1/nodes")
        assert status == 200 and "f-0" in body.decode(), body
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()


@pytest.mark.parametrize("module", [cp_sdnotify, router_sdnotify], ids=["controlplane", "router"])
def test_the_watchdog_is_fed_from_the_loop_and_a_frozen_loop_misses_it(tmp_path, monkeypatch,
                                                                       module):  # fmt: skip
    listener = NotifySocket(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", str(listener.path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # WatchdogSec=0.2: fed every 0.1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    fed: list[float] = []
    done = threading.Event()

    def hear() -> None:
        while not done.is_set():
            try:
                if "WATCHDOG=1" in listener.sock.recv(4096).decode().splitlines():
                    fed.append(time.monotonic())
            except TimeoutError:
                pass

    async def feed_then_freeze() -> tuple[float, float]:
        feeder = asyncio.create_task(module.feed_watchdog())
        await asyncio.sleep(0.6)
        frozen = time.monotonic()
        time.sleep(1.0)  # the loop does not come back to the feeder
        thawed = time.monotonic()
        await asyncio.sleep(0.35)
        feeder.cancel()
        return frozen, thawed

    hearing = threading.Thread(target=hear)
    hearing.start()
    try:
        frozen, thawed = asyncio.run(feed_then_freeze())
        time.sleep(0.3)
    finally:
        done.set()
        hearing.join()
        listener.close()
    before = [t for t in fed if t < frozen]
    assert len(before) >= 2, fed
    assert not [t for t in fed if frozen + 0.05 < t < thawed - 0.05], "nothing while frozen"
    assert [t for t in fed if t > thawed], "fed again once the loop is back"
    monkeypatch.setenv("WATCHDOG_PID", "1")  # another process's watchdog
    assert module.watchdog_period() is None

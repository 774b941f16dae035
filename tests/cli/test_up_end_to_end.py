"""`gpuctl up` end to end: a fleet from one command, used, inspected, hurt, and stopped."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from controlplane.agent.processes import process_alive
from tests.harness import BIN, free_port, wait_until
from tests.otlp_receiver import Receiver

pytestmark = pytest.mark.integration


def recorded(pid_file: Path) -> int:
    """The pid a part's NAME.pid holds: the number alone, as the README's `kill $(cat ...)`
    needs; NAME.json beside it says the same with the command."""
    pid = int(pid_file.read_text())
    assert json.loads(pid_file.with_suffix(".json").read_text())["pid"] == pid
    return pid


# What `| tee` does with the output, line by line.
TEE = "import sys\nfor line in sys.stdin.buffer:\n    sys.stdout.buffer.write(line)\n" \
    "    sys.stdout.buffer.flush()"


class Up:
    """`gpuctl up` on free loopback ports in `tmp_path`, as a user would run it."""

    def __init__(
        self, tmp_path, *flags: str, log_name: str = "up.log", piped: bool = False
    ) -> None:
        """piped: its output goes through a pipe to a reader (`self.reader`, as `| tee` would),
        which writes the log."""
        self.ports = {name: free_port() for name in ("server", "router", "admin")}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GPUCTL_")},
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # the SDK's spans out at once, for tests to read
        }
        self.log_path = tmp_path / log_name
        self.fleet = tmp_path / "fleet"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                str(BIN / "gpuctl"), "up", *flags, "--dir", str(tmp_path / "fleet"), "--simulate",
                "--server-listen", f"127.0.0.1:{self.ports['server']}",
                "--router-listen", f"127.0.0.1:{self.ports['router']}",
                "--sim-admin-listen", f"127.0.0.1:{self.ports['admin']}",
                "--tick", "0.5",
            ],
            stdout=subprocess.PIPE if piped else self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )  # fmt: skip
        self.reader = None
        if piped:
            self.reader = subprocess.Popen(
                [sys.executable, "-c", TEE],
                stdin=self.proc.stdout,
                stdout=self.log,
            )
            self.proc.stdout.close()

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_up(self) -> None:
        wait_until(
            lambda: "gpufleet is up" in self.output() or self.proc.poll() is not None,
            120,
            "gpuctl up",
        )
        assert self.proc.poll() is None, self.output()

    def stop(self) -> None:
        """Ctrl-C, as a terminal sends it (to the whole process group); it must stop within
        10 s, and cleanly."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        finally:
            self.log.close()
        assert self.proc.returncode == 0, self.output()


CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def test_gpuctl_up_end_to_end(tmp_path):
    receiver = Receiver()
    fleet = Up(tmp_path, "--otlp-endpoint", receiver.url, "--trace-sample", "0")
    ports, env, output = fleet.ports, fleet.env, fleet.output
    fleet_dir = tmp_path / "fleet"

    def gpuctl(*args):
        done = subprocess.run(
            [str(BIN / "gpuctl"), *args], env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def status():
        return json.loads(gpuctl("status", "-o", "json", "--idle-after", "60s"))

    def replicas():
        return {r["id"]: r for r in json.loads(gpuctl("replicas", "-o", "json"))["items"]}

    children = []
    try:
        fleet.wait_up()
        children = [recorded(p) for p in (fleet_dir / "pids").glob("*.pid")]
        assert len(children) == 3
        api = openai.OpenAI(
            base_url=f"http://127.0.0.1:{ports['router']}/v1", api_key="-", max_retries=0
        )
        answer = api.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content
        streamed = list(
            api.chat.completions.create(
                model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
        assert len(streamed) > 2

        first = status()
        assert first["replicas"]["by_state"] == {"Ready": 4}
        assert first["capacity"]["H100-80GB"]["total"] == 16
        assert first["capacity"]["A100-80GB"]["total"] == 8
        used_gpus = sum(c["used"] for c in first["capacity"].values())
        assert used_gpus == 4, "qwen2.5-1.5b, quiet, packed beside a llama-3.1-8b"

        # The tour: qwen2.5-1.5b scaled to seven packs beside the llamas, then cards apart.
        gpuctl("scale", "qwen2.5-1.5b", "7")

        def shared_cards():
            nodes = json.loads(gpuctl("nodes", "-o", "json"))["items"]
            return [c for n in nodes for c in n["cards"] if len(c["residents"]) == 2]

        wait_until(shared_cards, 60, "a card holding two engines")
        assert status()["capacity"]["A100-80GB"]["used"] == 7, "one A100 left empty"
        gpuctl("scale", "qwen2.5-1.5b", "1")
        wait_until(
            lambda: len([r for r in replicas().values() if r["model"] == "qwen2.5-1.5b"]) == 1,
            60,
            "qwen2.5-1.5b back to one replica",
        )
        wait_until(
            lambda: any(r["idle_state"] == "exact" for r in replicas().values()),
            what="the used replica to be seen used",
        )
        rows = replicas()
        used = [r for r in rows.values() if r["idle_state"] == "exact"]
        unused = [r for r in rows.values() if r["model"] == "qwen2.5-7b"]
        assert used and used[0]["model"] == "llama-3.1-8b" and used[0]["idle_s"] < 30
        assert unused[0]["idle_state"] == "at_least"
        bound = unused[0]["idle_s"]
        wait_until(
            lambda: replicas()[unused[0]["id"]]["idle_s"] > bound + 1,
            what="the lower bound to grow",
        )

        bound_before = replicas()[unused[0]["id"]]["idle_s"]
        router_pid = recorded(fleet_dir / "pids" / "router.pid")
        # The README's tour, as a shell runs it.
        frozen = subprocess.run(["sh", "-c", "kill -0 $(cat pids/router.pid)"], cwd=fleet_dir)
        assert frozen.returncode == 0
        os.kill(router_pid, signal.SIGTERM)
        wait_until(
            # NAME.json is written before NAME.pid: read alone, NAME.pid says when both are new.
            lambda: int((fleet_dir / "pids" / "router.pid").read_text()) != router_pid,
            what="gpuctl up to restart the router",
        )
        children.append(recorded(fleet_dir / "pids" / "router.pid"))
        # SIGTERM: the router said goodbye, and its next incarnation carries its watch on.
        wait_until(
            lambda: (
                json.loads(gpuctl("routers", "-o", "json"))["items"][0]["uptime_s"] < 20
                and replicas()[unused[0]["id"]]["idle_state"] == "at_least"
            ),
            what="the restarted router's report",
        )
        assert replicas()[unused[0]["id"]]["idle_s"] >= bound_before, "a clean restart keeps it"
        after = json.loads(gpuctl("status", "-o", "json"))  # each model's idle_after: 30m
        assert after["idle"]["replicas"] == [], "nothing idle past the models' thresholds"

        node = unused[0]["nodes"][0]
        held = {g for p in unused[0]["placement"] for g in p["gpus"]}
        free_gpu = next(i for i in range(8) if i not in held)
        gpuctl("sim", "gpu-fail", node, str(free_gpu), "--reason", "XID 79")
        hurt = wait_until(
            lambda: (s := status())["capacity"]["H100-80GB"]["unhealthy"] == 1 and s,
            what="the unhealthy GPU",
        )
        h100 = hurt["capacity"]["H100-80GB"]
        assert h100["free"] == first["capacity"]["H100-80GB"]["free"] - 1
        assert h100["used"] == first["capacity"]["H100-80GB"]["used"]
        assert "UNHEALTHY GPUS (1)" in gpuctl("status")
        engines = [
            json.loads(p.read_text())["pid"]
            for p in (fleet_dir / "agent" / "nodes").glob("*/replicas/*.json")
        ]
        assert len(engines) == 4
        children += engines

        # More models than cards: the last demo model fits only on the cards qwen holds.
        gpuctl("sim", "gpu-heal", node, str(free_gpu))
        wait_until(lambda: status()["capacity"]["H100-80GB"]["unhealthy"] == 0, what="healed")
        big = json.loads(gpuctl("models", "llama-3.1-405b", "-o", "json"))
        assert big["state"] == "ScaledToZero" and not big["reason"], big
        wait_until(lambda: replicas()[unused[0]["id"]]["age_s"] >= 31, 40, "qwen's min_residency")
        answer = api.chat.completions.create(
            model="llama-3.1-405b",
            messages=[{"role": "user", "content": "hi"}],
            timeout=60,
            extra_headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
        )
        assert answer.choices[0].message.content
        why_it_waited(receiver)
        swapped = status()
        assert swapped["room"]["swaps_last_hour"] == 1
        assert swapped["capacity"]["H100-80GB"]["used"] == 16
        models = {m["name"]: m for m in json.loads(gpuctl("models", "-o", "json"))["items"]}
        # qwen's engine sleeps (the demo gives it vLLM's sleep mode): it made room by falling
        # asleep on its cards, beside the newcomer, not by stopping.
        assert models["qwen2.5-7b"]["state"] == "Asleep"
        assert swapped["asleep"]["replicas"] == 1 and swapped["asleep"]["cards"] == 2
        assert models["llama-3.1-405b"]["state"] == "Ready"
        children += [
            json.loads(p.read_text())["pid"]
            for p in (fleet_dir / "agent" / "nodes").glob("*/replicas/*.json")
        ]

        # And back, as the README's tour shows: past the 405b's min_residency a request for
        # qwen takes the cards back and wakes it where it sleeps.
        (newcomer,) = [r for r in replicas().values() if r["model"] == "llama-3.1-405b"]
        wait_until(
            lambda: replicas()[newcomer["id"]]["age_s"] >= 31, 40, "the 405b's min_residency"
        )
        answer = api.chat.completions.create(
            model="qwen2.5-7b", messages=[{"role": "user", "content": "hi"}], timeout=60
        )
        assert answer.choices[0].message.content

        def states():
            items = json.loads(gpuctl("models", "-o", "json"))["items"]
            return {m["name"]: m["state"] for m in items}

        assert states()["qwen2.5-7b"] == "Ready"
        wait_until(lambda: states()["llama-3.1-405b"] == "ScaledToZero", 30, "the 405b gone")
    finally:
        fleet.stop()
        receiver.close()
    assert "gpufleet: stopped" in output()
    leftovers = [pid for pid in children if process_alive(pid)]
    assert leftovers == [], f"still running after gpuctl up stopped: {leftovers}"
    assert not list(Path(fleet_dir / "pids").glob("*.pid"))


def why_it_waited(receiver: Receiver) -> None:
    """One trace shows the client's request through the router to the engine, and its parked
    event names the control plane's trace of making room for it: the swap that kept it."""

    def spans_of_the_request():
        spans = [s for s in receiver.spans if s["trace_id"] == CLIENT_TRACE]
        services = {s["service"] for s in spans}
        return {"gpurouter", "sim-engine"} <= services and spans

    spans = wait_until(spans_of_the_request, 15, "the request's spans")
    (routed,) = [s for s in spans if s["service"] == "gpurouter"]
    assert routed["name"] == "chat llama-3.1-405b" and routed["parent_id"] == CLIENT_SPAN
    (engine,) = [s for s in spans if s["service"] == "sim-engine"]
    assert engine["parent_id"] == routed["span_id"], "the engine continues the router's span"
    assert "parked" in routed["events"] and "picked" in routed["events"], routed
    wake_trace = routed["event_attributes"]["parked"]["gpufleet.wake.trace_id"]
    assert routed["links"] and routed["links"][0][0] == wake_trace

    def the_wait():
        spans = [s for s in receiver.of("gpuctl-server") if s["trace_id"] == wake_trace]
        return any(s["name"].startswith("Place ") for s in spans) and spans

    decided = wait_until(the_wait, 15, "the control plane's spans of the wait")
    (demand,) = [s for s in decided if s["name"] == "demand llama-3.1-405b"]
    assert demand["parent_id"] == routed["span_id"], "the wait continues the waiting request"
    assert routed["links"][0][1] == demand["span_id"]
    names = {s["name"] for s in decided}
    assert "Place llama-3.1-405b" in names, names
    assert "Sleep qwen2.5-7b" in names, f"the victim put to sleep for it: {names}"


def test_gpuctl_up_over_tls_with_its_own_ca(tmp_path):
    fleet = Up(tmp_path, "--tls")
    ports, env, output = fleet.ports, fleet.env, fleet.output

    def gpuctl(*args, extra_env=None):
        return subprocess.run(
            [str(BIN / "gpuctl"), *args],
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=30,
        )

    try:
        fleet.wait_up()
        assert f"control plane  https://127.0.0.1:{ports['server']}" in output()
        status = gpuctl("status", "-o", "json")  # the config gpuctl up wrote names its CA
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["nodes"]["ready"] == 4
        api = openai.OpenAI(
            base_url=f"http://127.0.0.1:{ports['router']}/v1", api_key="-", max_retries=0
        )
        answer = api.chat.completions.create(model="llama-3.1-8b", messages=[])
        assert answer.choices[0].message.content, "the router follows the control plane on TLS"
        stranger = gpuctl(
            "--server",
            f"https://127.0.0.1:{ports['server']}",
            "status",
            extra_env={"GPUCTL_CONFIG": str(tmp_path / "none.yaml")},
        )
        assert stranger.returncode == 1
        assert "certificate this client does not trust" in stranger.stderr, stranger.stderr
    finally:
        fleet.stop()


def test_gpuctl_up_on_postgresql(tmp_path, postgres_dsn):
    fleet = Up(tmp_path, "--state", postgres_dsn)
    try:
        fleet.wait_up()
        assert f"state          {postgres_dsn}" in fleet.output()
        status = subprocess.run(
            [str(BIN / "gpuctl"), "status", "-o", "json"],
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["nodes"]["ready"] == 4
        api = openai.OpenAI(
            base_url=f"http://127.0.0.1:{fleet.ports['router']}/v1", api_key="-", max_retries=0
        )
        answer = api.chat.completions.create(model="llama-3.1-8b", messages=[])
        assert answer.choices[0].message.content
    finally:
        fleet.stop()
    assert not (tmp_path / "fleet" / "state.sqlite").exists(), "the state is in PostgreSQL"


def test_a_gpuctl_up_killed_with_kill_9_is_cleaned_up_by_the_next(tmp_path):
    first = Up(tmp_path, log_name="first.log")
    first.wait_up()
    fleet_dir = tmp_path / "fleet"
    engines = wait_until(
        lambda: [
            json.loads(p.read_text())["pid"]
            for p in (fleet_dir / "agent" / "nodes").glob("*/replicas/*.json")
        ],
        what="engines",
    )
    left = [recorded(p) for p in (fleet_dir / "pids").glob("*.pid")] + engines
    first.proc.kill()  # kill -9: it stops nothing itself
    first.proc.wait()
    first.log.close()
    assert all(process_alive(pid) for pid in left)
    second = Up(tmp_path, log_name="second.log")
    try:
        second.wait_up()
        assert "stopping what an earlier gpuctl up left running" in second.output()
        assert [pid for pid in left if process_alive(pid)] == []
    finally:
        second.stop()


def ctrl_c_stops_it_within(up: Up, seconds: float) -> float:
    """Ctrl-C as a terminal sends it; how long gpuctl up took to stop everything."""
    began = time.monotonic()
    parts = {p.stem: recorded(p) for p in (up.fleet / "pids").glob("*.pid")}
    os.killpg(up.proc.pid, signal.SIGINT)
    try:
        up.proc.wait(seconds)
    except subprocess.TimeoutExpired:
        running = [name for name, pid in parts.items() if process_alive(pid)]
        os.killpg(up.proc.pid, signal.SIGKILL)
        engines = [
            json.loads(record.read_text())["pid"]
            for record in (up.fleet / "agent" / "nodes").glob("*/replicas/*.json")
        ]
        for pid in [*parts.values(), *engines]:  # each in a session of its own: not in up's
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(
            f"still running {seconds} s after Ctrl-C, with {running} still up:\n{up.output()}"
            + "".join(
                f"\n--- the end of {log.name}:\n" + log.read_text(errors="replace")[-1500:]
                for log in sorted((up.fleet / "logs").glob("*.log"))
            )
        ) from None
    finally:
        up.log.close()
    return time.monotonic() - began


def test_ctrl_c_is_honoured_before_the_banner_and_with_a_request_in_flight(tmp_path):
    for folder in ("early", "late"):
        (tmp_path / folder).mkdir()
    early = Up(tmp_path / "early")
    wait_until(lambda: "waiting for replicas" in early.output(), 120, "the wait for replicas")
    ctrl_c_stops_it_within(early, 3.0)
    assert "gpufleet is up" not in early.output() and "gpufleet: stopped" in early.output()
    left = [recorded(p) for p in (tmp_path / "early" / "fleet" / "pids").glob("*.pid")]
    assert left == [], "every part stopped and its pid file gone"

    late = Up(tmp_path / "late")
    late.wait_up()
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{late.ports['router']}/v1", api_key="-",
                        max_retries=0)  # fmt: skip
    stream = api.chat.completions.create(model="llama-3.1-8b", messages=[], stream=True)
    next(iter(stream))  # a request in flight
    ctrl_c_stops_it_within(late, 3.0)
    assert late.proc.returncode == 0, late.output()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_stop_stops_everything_after_the_output_pipe_died(tmp_path, signum):
    """`gpuctl up | tee run.log`, then Ctrl-C (the same SIGINT kills tee first) or a closed
    terminal (SIGHUP): every part and every engine stops all the same."""
    up = Up(tmp_path, piped=True)
    up.wait_up()
    engines = wait_until(
        lambda: [
            json.loads(p.read_text())["pid"]
            for p in (up.fleet / "agent" / "nodes").glob("*/replicas/*.json")
        ],
        what="engines",
    )
    started = [recorded(p) for p in (up.fleet / "pids").glob("*.pid")] + engines
    up.reader.kill()  # the pipe's reader goes first
    up.reader.wait()
    os.kill(up.proc.pid, signum)
    try:
        up.proc.wait(30)
        wait_until(
            lambda: not any(process_alive(pid) for pid in started), 10, "every part and engine gone"
        )
    finally:
        up.log.close()
        for pid in [up.proc.pid, *started]:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert up.proc.returncode == 0

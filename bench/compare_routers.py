"""Compare gpurouter with nginx and the Rust routers on the same backend, one core each.

    python bench/compare_routers.py [--seconds 10] [--connections 64]
        [--vllm-router PATH] [--sglang-router PATH]

Not part of CI. The backend is bench/fixed_upstream.py (a fixed JSON answer, fast enough not
to be what is measured); each proxy is pinned to CPU 0 with `taskset`, the backend and the load
generator (wrk if installed, else bench/loadgen.py) to the other CPUs. Contenders that are not
installed are skipped. Tiny JSON bodies, keep-alive connections on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BODY = '{"model": "m", "prompt": "hi", "max_tokens": 4}'
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"port {port} never opened")


def pinned(cpus: str, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if shutil.which("taskset") else argv


def start(argv, log: Path, cwd=None) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """User+system CPU of a process and its children so far."""
    total = 0.0
    for task in [pid] + [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-g", str(os.getpgid(pid))], capture_output=True, text=True
        ).stdout.split()
        if int(p) != pid
    ]:
        try:
            fields = Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            pass
    return total


def load(url: str, seconds: float, connections: int, work: Path) -> dict:
    other_cpus = f"1-{os.cpu_count() - 1}" if (os.cpu_count() or 1) > 1 else "0"
    if shutil.which("wrk"):
        script = work / "post.lua"
        script.write_text(
            f"wrk.method = \"POST\"\nwrk.body = '{BODY}'\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        done = subprocess.run(
            pinned(
                other_cpus,
                [
                    "wrk",
                    "-t",
                    "2",
                    "-c",
                    str(connections),
                    "-d",
                    f"{max(1, round(seconds))}s",
                    "--latency",
                    "-s",
                    str(script),
                    url,
                ],
            ),
            capture_output=True,
            text=True,
            timeout=seconds + 30,
        )
        out = done.stdout
        found = re.search(r"Requests/sec:\s+([\d.]+)", out)
        if found is None:
            raise RuntimeError(f"wrk said: {out or done.stderr}")
        rps = float(found.group(1))

        def latency(q):
            value, unit = re.search(rf"{q}%\s+([\d.]+)(us|ms|s)", out).groups()
            return float(value) * {"us": 1e-3, "ms": 1, "s": 1e3}[unit]

        errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        return {
            "rps": rps,
            "p50_ms": latency(50),
            "p99_ms": latency(99),
            "errors": int(errors.group(1)) if errors else 0,
            "tool": "wrk",
        }
    done = subprocess.run(
        pinned(
            other_cpus,
            [
                sys.executable,
                "-m",
                "bench.loadgen",
                url,
                "--body",
                BODY,
                "--connections",
                str(connections),
                "--seconds",
                str(seconds),
            ],
        ),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=seconds + 60,
        check=True,
    )
    return {**json.loads(done.stdout), "tool": "loadgen"}


def nginx_conf(work: Path, port: int, backend: int) -> Path:
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {work}/body;
  proxy_temp_path {work}/proxy;
  upstream backend {{ server 127.0.0.1:{backend}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
""")
    return conf


def contenders(backend_url: str, work: Path, args) -> dict:
    found = {
        "gpurouter": lambda port: [
            str(Path(sys.executable).parent / "gpurouter"),
            "--listen",
            f"127.0.0.1:{port}",
            "--backend",
            f"m={backend_url}",
        ],
    }
    if shutil.which("nginx"):
        backend_port = int(backend_url.rsplit(":", 1)[1])
        found["nginx"] = lambda port: [
            "nginx",
            "-c",
            str(nginx_conf(work, port, backend_port)),
            "-p",
            str(work),
        ]
    for name, path in (("vllm-router", args.vllm_router), ("sglang-router", args.sglang_router)):
        binary = path or shutil.which(name)
        if binary:
            extra = ["launch"] if name == "sglang-router" else []
            found[name] = lambda port, b=binary, e=extra: [
                b,
                *e,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--worker-urls",
                backend_url,
                "--policy",
                "round_robin",
            ]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--vllm-router")
    parser.add_argument("--sglang-router")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufleet-compare-"))
    (work / "body").mkdir()
    (work / "proxy").mkdir()
    backend_port = free_port()
    other_cpus = f"1-{os.cpu_count() - 1}" if (os.cpu_count() or 1) > 1 else "0"
    backend = start(
        pinned(other_cpus, [sys.executable, "-m", "bench.fixed_upstream", str(backend_port)]),
        work / "backend.log",
        cwd=ROOT,
    )
    backend_url = f"http://127.0.0.1:{backend_port}"
    rows = []
    try:
        wait_port(backend_port)
        rows.append(
            (
                "direct",
                load(backend_url + "/v1/completions", args.seconds, args.connections, work),
                None,
            )
        )
        for name, argv in contenders(backend_url, work, args).items():
            port = free_port()
            proc = start(pinned("0", argv(port)), work / f"{name}.log")
            try:
                wait_port(port, 60)
                time.sleep(1.0)  # health checks of the Rust routers, warm-up
                load(f"http://127.0.0.1:{port}/v1/completions", 2, args.connections, work)
                before = cpu_seconds(proc.pid)
                result = load(
                    f"http://127.0.0.1:{port}/v1/completions", args.seconds, args.connections, work
                )
                cores = (cpu_seconds(proc.pid) - before) / args.seconds
                rows.append((name, result, cores))
            except Exception as exc:  # one contender failing does not stop the table
                rows.append((name, {"error": f"{exc}; see {work / (name + '.log')}"}, None))
            finally:
                stop(proc)
    finally:
        stop(backend)
    print(
        f"\n{args.connections} keep-alive connections, {args.seconds:.0f} s, tiny JSON, "
        "proxy pinned to CPU 0\n"
    )
    print(
        f"{'':14} {'req/s':>9} {'cores':>6} {'req/s/core':>11} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'errors':>7}"
    )
    for name, r, cores in rows:
        if "error" in r:
            print(f"{name:14} failed: {r['error']}")
            continue
        per_core = f"{r['rps'] / cores:11.0f}" if cores else f"{'-':>11}"
        used = f"{cores:6.2f}" if cores else f"{'-':>6}"
        print(
            f"{name:14} {r['rps']:9.0f} {used} {per_core} {r['p50_ms']:8.2f} "
            f"{r['p99_ms']:8.2f} {r['errors']:7d}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

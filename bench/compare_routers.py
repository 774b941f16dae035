"""Compare gpurouter with nginx and the Rust routers on the same backend, one core each.

    python bench/compare_routers.py [--seconds 10] [--connections 64] [--workers 1]
        [--mode json|sse|streams] [--tokens 64] [--streams 10000] [--rounds 1]
        [--with-relay] [--tenant [--paired --slices 40 --gate]] [--vllm-router PATH]
        [--sglang-router PATH]

Not part of CI, but for `--tenant --paired --gate` (bench/test_tenants_gate.py). The backend
is bench/fixed_upstream.py (fixed answers, fast enough not to be what is measured); each proxy
is pinned to its `--workers` CPUs with `taskset`, the backend and the load generator (wrk if
installed, else bench/loadgen.py) to the others. Contenders that are not installed are skipped.
Keep-alive connections on both sides.

- json: a tiny JSON answer per request; req/s per core of the proxy. Each row also splits the
  proxy's CPU per answer into user and system time: what the proxy's own code costs, apart
  from the kernel's share of moving the bytes.
- sse: `--tokens` SSE events per answer, each written on its own; chunks/s per core.
- streams: `--streams` streaming requests held open at once, one slow event a second; the
  proxy's resident memory per open stream (RSS after they opened minus before, over N).

`--rounds N` (json, sse) runs every contender N times in turn and shows each one's median
round, then gpurouter's rate per core over nginx's round by round: on a shared machine one
round's ratio can move by a tenth with what else runs.

`--tenant --paired [--rounds N] [--slices K] [--gate]` measures what a tenant's key and limits
cost: gpurouter with and without them run at once on the proxy's CPU and the load takes turns
between them in K short slices, each router's CPU read around every slice, N rounds of fresh
processes; `--gate` exits 1 unless the median round's rate per core with the tenant is at least
0.95x.
`--traces --paired` does the same for traces: gpurouter with `--otlp-endpoint` (a sink in
this process) at `--trace-sample 0.01` against gpurouter without; `--gate`: at least 0.97x.
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
STREAM_BODY = '{"model": "m", "prompt": "hi", "max_tokens": 64, "stream": true}'
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


def group_of(pid: int) -> list[int]:
    """The process and the others of its process group (workers, children)."""
    listed = subprocess.run(
        ["pgrep", "-g", str(os.getpgid(pid))], capture_output=True, text=True
    ).stdout.split()
    return [pid] + [int(p) for p in listed if int(p) != pid]


def rss_bytes(pid: int) -> int:
    total = 0
    for task in group_of(pid):
        try:
            status = Path(f"/proc/{task}/status").read_text()
        except OSError:
            continue
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        total += int(found.group(1)) * 1024 if found else 0
    return total


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU of a process and its children so far."""
    user = system = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for task in group_of(pid):
        try:
            fields = Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()
            user += int(fields[11]) / tick
            system += int(fields[12]) / tick
        except (OSError, IndexError):
            pass
    return user, system


def load(
    url: str, seconds: float, connections: int, work: Path, body: str, other_cpus: str,
    tool: str = "wrk", key: str = "",
) -> dict:  # fmt: skip
    """`key`: sent as `Authorization: Bearer KEY` (to every contender alike)."""
    if tool == "wrk" and shutil.which("wrk"):
        script = work / "post.lua"
        script.write_text(
            f"wrk.method = \"POST\"\nwrk.body = '{body}'\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
            + (f'wrk.headers["Authorization"] = "Bearer {key}"\n' if key else "")
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
                body,
                "--connections",
                str(connections),
                "--seconds",
                str(seconds),
                *(["--header", f"Authorization: Bearer {key}"] if key else []),
            ],
        ),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=seconds + 60,
        check=True,
    )
    return {**json.loads(done.stdout), "tool": "loadgen"}


BENCH_KEY = "gfk_bench-key-of-the-comparison"


def tenants_file(work: Path) -> Path:
    """A tenant with every limit on, none of them reached: what is measured is the checks."""
    import hashlib

    path = work / "tenants.yaml"
    digest = hashlib.sha256(BENCH_KEY.encode()).hexdigest()
    path.write_text(
        "tenants:\n  - name: bench\n    requests_per_minute: 100000000\n"
        "    tokens_per_minute: 100000000000\n    max_in_flight: 100000\n"
        f"    key_sha256: [{digest}]\n"
    )
    return path


def nginx_binary() -> str | None:
    """nginx on the PATH, else the copy `make` unpacks beside the virtual environment's
    programs (Debian's package, not installed: see the Makefile's `$(NGINX)`)."""
    return shutil.which("nginx") or shutil.which("nginx", path=str(Path(sys.executable).parent))


def nginx_conf(work: Path, port: int, backend: int, workers: int) -> Path:
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes {workers};
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 20000; }}
http {{
  access_log off;
  client_body_temp_path {work}/body;
  proxy_temp_path {work}/proxy;
  fastcgi_temp_path {work}/fastcgi;
  uwsgi_temp_path {work}/uwsgi;
  scgi_temp_path {work}/scgi;
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
            "--workers",
            str(args.workers),
        ],
    }
    if getattr(args, "traces", False):
        found["gpurouter+traces"] = lambda port: [
            *found["gpurouter"](port), "--otlp-endpoint", args.sink,
            "--trace-sample", str(args.trace_sample),
        ]  # fmt: skip
    if args.tenant:
        found["gpurouter+tenant"] = lambda port: [
            *found["gpurouter"](port), "--tenants-file", str(tenants_file(work))
        ]  # fmt: skip
    backend_port = int(backend_url.rsplit(":", 1)[1])
    if args.with_relay:
        found["uvloop-relay"] = lambda port: [
            sys.executable, "-m", "bench.tcp_relay", str(port), str(backend_port)
        ]  # fmt: skip
    nginx = nginx_binary()
    if nginx:
        found["nginx"] = lambda port: [
            nginx,
            "-e",  # not the package's /var/log/nginx, which an unpacked copy has not
            str(work / "nginx-error.log"),
            "-c",
            str(nginx_conf(work, port, backend_port, args.workers)),
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


def cpu_split(workers: int) -> tuple[str, str]:
    """CPUs for the proxy's workers, and the others for the backend and the load."""
    cpus = os.cpu_count() or 1
    proxy = f"0-{workers - 1}" if workers > 1 else "0"
    if workers >= cpus:
        print(f"note: {workers} worker(s) on {cpus} CPUs: the load shares the proxy's CPUs")
        return proxy, f"0-{cpus - 1}"
    return proxy, f"{workers}-{cpus - 1}" if cpus - workers > 1 else str(workers)


def throughput(name, proc, url, args, work, other_cpus) -> tuple[dict, float]:
    """The load's result (with the proxy's user and system CPU per answer) and the cores the
    proxy used."""
    body = STREAM_BODY if args.mode == "sse" else BODY
    key = BENCH_KEY if args.tenant else ""
    load(url, 2, args.connections, work, body, other_cpus, args.load, key)  # warm-up
    user, system = cpu_seconds(proc.pid)
    result = load(url, args.seconds, args.connections, work, body, other_cpus, args.load, key)
    user_after, system_after = cpu_seconds(proc.pid)
    answers = max(1.0, result["rps"] * args.seconds)
    result["user_us"] = (user_after - user) * 1e6 / answers
    result["system_us"] = (system_after - system) * 1e6 / answers
    return result, (user_after - user + system_after - system) / args.seconds


def memory_per_stream(proc, url, args, other_cpus) -> dict:
    before = rss_bytes(proc.pid)
    holder = subprocess.Popen(
        pinned(
            other_cpus,
            [sys.executable, "-m", "bench.open_streams", url, "--streams", str(args.streams),
             "--hold", "5"],
        ),
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )  # fmt: skip
    try:
        line = holder.stdout.readline().split()
        opened = int(line[1]) if line[:1] == ["open"] else 0
        time.sleep(1.0)
        after = rss_bytes(proc.pid)
        gaps = holder.stdout.readline()
    finally:
        holder.wait(60)
    if not opened:
        raise RuntimeError("no stream opened")
    gap = json.loads(gaps.split(" ", 1)[1]) if gaps.startswith("gaps ") else {}
    return {
        "streams": opened,
        "rss_before": before,
        "per_stream": (after - before) / opened,
        **{f"gap_{k}": v for k, v in gap.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--mode", choices=["json", "sse", "streams"], default="json")
    parser.add_argument("--tokens", type=int, default=64, help="SSE events per answer (sse)")
    parser.add_argument("--streams", type=int, default=10_000, help="open at once (streams)")
    parser.add_argument(
        "--with-relay",
        action="store_true",
        help="also a uvloop TCP relay that parses nothing: the ceiling of Python protocols",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="json, sse: run the contenders this many times; --paired: rounds of fresh pairs",
    )
    parser.add_argument(
        "--load",
        choices=["wrk", "loadgen"],
        help="the load generator; default: wrk for json, loadgen for sse (it times the gaps"
        " in each answer, and wrk's SSE tail is its own: see docs/operations.md)",
    )
    parser.add_argument(
        "--tenant",
        action="store_true",
        help="also gpurouter with a tenant's key and every limit on (--tenants-file); the"
        " key goes with every contender's requests",
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="with --tenant: gpurouter with and without the tenant at once on the proxy's"
        " CPUs, the load taking turns between them in short slices (bench.alternating_load);"
        " --gate: exit 1 unless the rate per core with the tenant is at least"
        f" {TENANT_RATIO}x the rate without",
    )
    parser.add_argument(
        "--traces",
        action="store_true",
        help="with --paired: gpurouter with traces at 1%% (--otlp-endpoint to a sink) against"
        f" gpurouter without; --gate: at least {TRACE_RATIO}x",
    )
    parser.add_argument(
        "--trace-sample",
        type=float,
        default=0.01,
        help="--traces: the share of requests traced (the gate's bound is for 0.01)",
    )
    parser.add_argument(
        "--nginx",
        action="store_true",
        help="with --paired: gpurouter at the defaults against nginx in front of the same"
        f" backend; --gate: at least {NGINX_RATIO}x nginx's rate per core",
    )
    parser.add_argument("--slices", type=int, default=40, help="--paired: turns in all")
    parser.add_argument(
        "--warm",
        type=float,
        default=0.0,
        help="--paired: start every pair at the outset and begin each round once its pair is"
        " this many seconds old (61: a tenant's buckets full, as after a minute)",
    )
    parser.add_argument("--vllm-router")
    parser.add_argument("--sglang-router")
    parser.add_argument(
        "--gate",
        action="store_true",
        help="exit 1 unless gpurouter's p99 and p99 longest gap are within 1.2x nginx's (sse);"
        " with --paired, as --paired says",
    )
    args = parser.parse_args()
    if args.paired and (args.tenant + args.traces + args.nginx != 1 or args.mode != "json"):
        parser.error("--paired compares gpurouter with and without --tenant or --traces, or"
                     " with nginx (one of the three), in json mode")  # fmt: skip
    if args.nginx and not nginx_binary():
        parser.error("--nginx: nginx is not on the PATH (`make` unpacks Debian's beside the"
                     " virtual environment)")  # fmt: skip
    if args.traces:
        args.sink = start_sink()
    args.load = args.load or ("loadgen" if args.mode == "sse" else "wrk")
    import resource

    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if args.mode == "streams" and 2 * args.streams + 100 > limit:
        args.streams = (limit - 100) // 2
        print(f"note: --streams lowered to {args.streams}: a proxy holds two sockets a stream "
              f"and the open-file limit is {limit}")  # fmt: skip
    proxy_cpus, other_cpus = cpu_split(args.workers)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-compare-"))
    (work / "body").mkdir()
    (work / "proxy").mkdir()
    backend_port = free_port()
    backend_argv = [sys.executable, "-m", "bench.fixed_upstream", str(backend_port)]
    if args.mode == "sse":
        backend_argv += ["--sse", str(args.tokens)]
    elif args.mode == "streams":
        backend_argv += ["--sse", "600", "--every", "1"]
    backend = start(pinned(other_cpus, backend_argv), work / "backend.log", cwd=ROOT)
    backend_url = f"http://127.0.0.1:{backend_port}"
    rows = []
    if args.paired:
        try:
            wait_port(backend_port)
            return paired(backend_url, work, args, proxy_cpus, other_cpus)
        finally:
            stop(backend)
    try:
        wait_port(backend_port)
        if args.mode != "streams":
            body = STREAM_BODY if args.mode == "sse" else BODY
            direct = load(
                backend_url + "/v1/completions", args.seconds, args.connections, work, body,
                other_cpus, args.load,
            )  # fmt: skip
            rows.append(("direct", direct, None))
        rounds = 1 if args.mode == "streams" else args.rounds
        by_contender: dict[str, list] = {}
        for _ in range(rounds):
            for name, argv in contenders(backend_url, work, args).items():
                by_contender.setdefault(name, []).append(
                    measure(name, argv, proxy_cpus, other_cpus, work, args)
                )
        rows += [(name, *median_round(results)) for name, results in by_contender.items()]
    finally:
        stop(backend)
    print_table(rows, args)
    if rounds > 1:
        print_ratios(by_contender)
    return tail_gate(dict((name, r) for name, r, _ in rows)) if args.gate else 0


TAIL_RATIO = 1.2
TENANT_RATIO = 0.95  # the rate per core with a tenant's limits on, over the rate without
TRACE_RATIO = 0.97  # the rate per core with traces at 1%, over the rate without
NGINX_RATIO = 1.0  # gpurouter's rate per core over nginx's, in front of the same backend


def start_sink() -> str:
    """An OTLP/HTTP endpoint that takes every batch and keeps nothing: what the router's
    exporter sends to is not what is measured."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1/traces"


def paired(backend_url: str, work: Path, args, proxy_cpus: str, other_cpus: str) -> int:
    """gpurouter without and with a tenant (its key sent to both), both running on the
    proxy's CPUs, the load taking turns between them (bench.alternating_load). Each round
    has a pair of its own processes, the first started and served first alternating round by
    round: a process's own luck (where its memory landed) and its place in the turns weigh on
    both alike over the rounds. The rate per core is all answers over all of the router's CPU.

    `--warm S`: every pair is started at the outset on the other CPUs, and a round begins once
    its pair is S seconds old, moved onto the proxy's CPUs for its turn: a tenant's buckets
    start from a second of its share and are full after a minute, the state of a router that
    has known its tenant for that long."""
    argvs = contenders(backend_url, work, args)
    if args.nginx:
        names, least = ["nginx", "gpurouter"], NGINX_RATIO
    elif args.traces:
        names, least = ["gpurouter", "gpurouter+traces"], TRACE_RATIO
    else:
        names, least = ["gpurouter", "gpurouter+tenant"], TENANT_RATIO
    rounds = []
    pairs = []
    try:
        for number in range(args.rounds if args.warm else 0):
            pairs.append(start_pair(argvs, names, number, work, other_cpus))
        for number in range(args.rounds):
            if args.warm:
                pair = pairs[number]
            else:
                pair = start_pair(argvs, names, number, work, proxy_cpus)
                pairs.append(pair)
            order, procs, urls, started = pair
            time.sleep(max(0.0, started + args.warm - time.monotonic()))
            if args.warm:
                for proc in procs:
                    move_group(proc.pid, proxy_cpus)
            done = subprocess.run(
                pinned(
                    other_cpus,
                    [sys.executable, "-m", "bench.alternating_load",
                     *(f"{url}={proc.pid}" for url, proc in zip(urls, procs, strict=True)),
                     "--slices", str(args.slices),
                     "--slice-seconds", str(args.seconds / args.slices),
                     "--connections", str(args.connections), "--body", BODY,
                     *([] if args.nginx else
                       ["--header", f"Authorization: Bearer {BENCH_KEY}"])],
                ),
                capture_output=True, text=True, cwd=ROOT, timeout=args.seconds * 3 + 60,
                check=True,
            )  # fmt: skip
            for proc in procs:
                stop(proc)
            slices = json.loads(done.stdout)
            rounds.append([{**s, "name": order[s["proxy"]]} for s in slices])
    finally:
        for _, procs, _, _ in pairs:
            for proc in procs:
                stop(proc)
    return report_rounds(rounds, names, args.gate, least, median=True)


def start_pair(argvs: dict, names: list[str], number: int, work: Path, cpus: str) -> tuple:
    """Round `number`'s two routers, started and answering: (their order, the processes,
    their URLs, when they were started)."""
    order = names if number % 2 == 0 else names[::-1]
    procs, urls = [], []
    started = time.monotonic()
    for name in order:
        port = free_port()
        procs.append(start(pinned(cpus, argvs[name](port)), work / f"{name}.log"))
        urls.append(f"http://127.0.0.1:{port}/v1/completions")
    for url in urls:
        wait_port(int(url.split(":")[2].split("/")[0]), 60)
    return order, procs, urls, started


def move_group(pid: int, cpus: str) -> None:
    """Every thread of `pid`'s process group onto `cpus` ("0", "0-3")."""
    first, _, last = cpus.partition("-")
    allowed = set(range(int(first), int(last or first) + 1))
    for member in group_of(pid):
        for task in Path(f"/proc/{member}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), allowed)
            except (OSError, ValueError):
                pass  # a thread that ended between the listing and the move


def pooled(slices: list[dict], name: str) -> tuple[int, float, int]:
    """(answers, CPU seconds, errors) of `name`'s slices."""
    mine = [s for s in slices if s["name"] == name]
    return (
        sum(s["answers"] for s in mine),
        sum(s["cpu_ns"] for s in mine) / 1e9,
        sum(s["errors"] for s in mine),
    )


def report_rounds(
    rounds: list[list[dict]], names: list[str], gate: bool, least: float, median: bool = False
) -> int:
    every = [s for slices in rounds for s in slices]
    print(f"\n{len(rounds)} round(s) of {len(rounds[0])} slices taking turns;"
          " rate per core: answers per second of the router's CPU\n")  # fmt: skip
    rates = {}
    for name in names:
        answers, cpu, errors = pooled(every, name)
        rates[name] = answers / cpu if cpu else 0.0
        print(f"{name:18} {answers:8d} answers {cpu:7.2f} s CPU {rates[name]:9.0f}/core"
              f" {1e6 * cpu / max(answers, 1):7.2f} µs per answer {errors} errors")  # fmt: skip
    by_round = []
    for slices in rounds:
        (a, a_cpu, _), (b, b_cpu, _) = (pooled(slices, name) for name in names)
        by_round.append((b / b_cpu) / (a / a_cpu) if a and a_cpu and b_cpu else 0.0)
    ratio = rates[names[1]] / rates[names[0]] if rates[names[0]] else 0.0
    listed = " ".join(f"{r:.3f}" for r in by_round)
    ranked = sorted(by_round)
    middle = (
        ranked[len(ranked) // 2]
        if len(ranked) % 2
        else sum(ranked[len(ranked) // 2 - 1 : len(ranked) // 2 + 1]) / 2
    )
    quarter = len(ranked) // 4
    middle_half = ranked[quarter : len(ranked) - quarter]
    central = sum(middle_half) / len(middle_half)
    print(f"\n{names[1]} / {names[0]} per core: {ratio:.3f} (round by round: {listed};"
          f" median round {middle:.3f}; mean of the middle half {central:.3f})")  # fmt: skip
    errors = sum(s["errors"] for s in every)
    if not gate:
        return 0
    # A round's figure swings with its pair of processes and what else this shared machine
    # ran (and, for traces, with how many of the exporter's batches landed in it): not a pool
    # that one slowed round moves (four rounds of 0.954 0.915 0.975 0.890 were seen), but the
    # mean of the middle half of the rounds, as steady as the median is against such a round
    # and closer to the true figure for as many rounds (the median takes one or two rounds).
    judged = central if median else ratio
    verdict = "ok" if judged >= least and not errors else "FAILED"
    print(f"gate: {judged:.3f} (at least {least}), {errors} errors {verdict}")
    return 0 if verdict == "ok" else 1


def tail_gate(results: dict[str, dict]) -> int:
    """gpurouter's tail against nginx's in the same run: the answer's p99 and the p99 of its
    longest gap between chunks, each at most TAIL_RATIO times nginx's."""
    ours, theirs = results.get("gpurouter", {}), results.get("nginx", {})
    if "gap_p99_ms" not in ours or "gap_p99_ms" not in theirs:
        print("gate: needs gpurouter and nginx, measured by loadgen (--mode sse)")
        return 1
    failed = 0
    for key in ("p99_ms", "gap_p99_ms"):
        ratio = ours[key] / max(theirs[key], 1e-3)
        verdict = "ok" if ratio <= TAIL_RATIO else "FAILED"
        failed += verdict != "ok"
        print(f"gate: {key} gpurouter/nginx {ratio:.2f} (at most {TAIL_RATIO}) {verdict}")
    return 1 if failed else 0


def measure(name, argv, proxy_cpus, other_cpus, work, args) -> tuple[dict, float | None]:
    port = free_port()
    proc = start(pinned(proxy_cpus, argv(port)), work / f"{name}.log", cwd=ROOT)
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        wait_port(port, 60)
        time.sleep(1.0)  # health checks of the Rust routers, warm-up
        if args.mode == "streams":
            return memory_per_stream(proc, url, args, other_cpus), None
        return throughput(name, proc, url, args, work, other_cpus)
    except Exception as exc:  # one contender failing does not stop the table
        return {"error": f"{exc}; see {work / (name + '.log')}"}, None
    finally:
        stop(proc)


def per_core(result: tuple[dict, float | None]) -> float:
    answers, cores = result
    return answers["rps"] / cores if "rps" in answers and cores else 0.0


def median_round(results: list) -> tuple[dict, float | None]:
    """The round whose rate per core is the median one (the lower middle of an even count)."""
    ranked = sorted(results, key=per_core)
    return ranked[(len(ranked) - 1) // 2]


RATIOS = (("gpurouter", "nginx"), ("gpurouter+tenant", "gpurouter"))


def print_ratios(by_contender: dict[str, list]) -> None:
    for ours_name, theirs_name in RATIOS:
        if ours_name not in by_contender or theirs_name not in by_contender:
            continue
        ratios = [
            per_core(ours) / per_core(theirs)
            for ours, theirs in zip(by_contender[ours_name], by_contender[theirs_name], strict=True)
            if per_core(theirs)
        ]
        if ratios:
            listed = " ".join(f"{r:.2f}" for r in ratios)
            middle = sorted(ratios)[(len(ratios) - 1) // 2]
            print(
                f"\n{ours_name} / {theirs_name} per core, round by round: {listed}"
                f" (median {middle:.2f})"
            )


def print_table(rows, args) -> None:
    where = f"proxy pinned to CPU {'0' if args.workers == 1 else f'0-{args.workers - 1}'}"
    if args.mode == "streams":
        print(f"\nstreams held open at once, one event a second, {where}\n")
        print(
            f"{'':14} {'streams':>8} {'RSS before MB':>14} {'KB per stream':>14}"
            f" {'gap p50':>8} {'gap p99':>8} {'gap p99.9':>9} {'gap max':>8}  (ms between events)"
        )
        for name, r, _ in rows:
            if "error" in r:
                print(f"{name:14} failed: {r['error']}")
                continue
            print(
                f"{name:14} {r['streams']:8d} {r['rss_before'] / 1e6:14.1f}"
                f" {r['per_stream'] / 1024:14.1f} {r.get('gap_p50_ms', 0):8.0f}"
                f" {r.get('gap_p99_ms', 0):8.0f} {r.get('gap_p999_ms', 0):9.0f}"
                f" {r.get('gap_max_ms', 0):8.0f}"
            )
        return
    unit = "chunks/s" if args.mode == "sse" else "req/s"
    per_answer = args.tokens + 1 if args.mode == "sse" else 1  # the events and [DONE]
    what = f"{args.tokens} SSE events per answer" if args.mode == "sse" else "tiny JSON"
    print(
        f"\n{args.connections} keep-alive connections, {args.seconds:.0f} s, {what}, "
        f"{args.workers} worker(s), {where}\n"
    )
    print(
        f"{'':14} {'req/s':>9} {'cores':>6} {unit + '/core':>15} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'p99.9':>7} {'gap p99':>8} {'p99.9':>7} {'errors':>7} {'user µs':>8} {'sys µs':>7}"
        "  (gap: the longest wait for one chunk of an answer; CPU per answer)"
    )
    for name, r, cores in rows:
        if "error" in r:
            print(f"{name:14} failed: {r['error']}")
            continue
        per_core = f"{r['rps'] * per_answer / cores:15.0f}" if cores else f"{'-':>15}"
        used = f"{cores:6.2f}" if cores else f"{'-':>6}"
        split = f" {'-':>8} {'-':>7}"
        if "user_us" in r:
            split = f" {r['user_us']:8.2f} {r['system_us']:7.2f}"
        tail = f" {'-':>7} {'-':>8} {'-':>7}"
        if "p999_ms" in r:
            tail = f" {r['p999_ms']:7.1f} {r['gap_p99_ms']:8.1f} {r['gap_p999_ms']:7.1f}"
        print(
            f"{name:14} {r['rps']:9.0f} {used} {per_core} {r['p50_ms']:8.2f} "
            f"{r['p99_ms']:8.2f}{tail} {r['errors']:7d}{split}"
        )


if __name__ == "__main__":
    sys.exit(main())

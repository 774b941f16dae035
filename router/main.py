"""`gpurouter`: the command line of the data plane."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
from urllib.parse import urlsplit

import click
import yaml

from router.control.leader import ControlPlanes
from router.control.routes import static_config
from router.credentials import credential, credential_text
from router.listen import parse_listen
from router.path.context import ProxyConfig
from router.server import RouterServer, RouterSettings
from router.tenancy.tenantsfile import read_tenants_file


def read_token(path: str | None) -> str | None:
    """The router's token: a file holding just the token, or YAML with a `router` entry."""
    if not path:
        return None
    with open(path) as f:
        text = f.read().strip()
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        loaded = None
    if isinstance(loaded, dict):
        return str(loaded.get("router") or loaded.get("admin") or "") or None
    return text or None


@click.command(
    context_settings={"auto_envvar_prefix": "GPUROUTER", "help_option_names": ["-h", "--help"]}
)
@click.option("--listen", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to serve.")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="MODEL=URL",
    help="A static endpoint (repeatable); no control plane needed.",
)
@click.option(
    "--routes",
    "routes_file",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML file of {model: [url, ...]}.",
)
@click.option(
    "--control-plane",
    metavar="URL[,URL...]",
    help="Follow this control plane's routes; several URLs: servers on one database, of which "
    "the router follows the leader.",
)
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False),
    help="CA certificate (PEM) that signed an https:// control plane's certificate.",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Router token for the control plane.",
)
@click.option(
    "--api-keys-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Accepted client API keys, one a line; none: no key needed.",
)
@click.option(
    "--metrics-token",
    default="",
    envvar="GPUROUTER_METRICS_TOKEN",
    help="What /metrics and /activity ask for (Authorization: Bearer). Without it, a router"
    " whose fleet has tenants answers neither on its client port: they name every tenant.",
)
@click.option(
    "--tenants-file",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML of tenants, their limits and their keys' SHA-256, for a router without a"
    " control plane (a control plane sends its own).",
)
@click.option(
    "--tick", "tick_s", default=2.0, show_default=True, help="Activity report period (s)."
)
@click.option("--workers", default=1, show_default=True, help="Processes sharing the port.")
@click.option(
    "--router-id",
    default="",
    help="Stable name in activity reports (default: host, listen address, worker).",
)
@click.option("--max-body", "max_body_bytes", default=32 * 1024 * 1024, show_default=True)
@click.option("--connect-timeout", default=5.0, show_default=True)
@click.option(
    "--first-byte-timeout",
    default=600.0,
    show_default=True,
    help="Upstream time to first byte (prefill can take minutes).",
)
@click.option(
    "--idle-timeout",
    default=120.0,
    show_default=True,
    help="Upstream silence allowed between two chunks.",
)
@click.option(
    "--client-timeout",
    default=30.0,
    show_default=True,
    help="Time a client has to send headers and body (then 408).",
)
@click.option(
    "--drain",
    "drain_s",
    default=30.0,
    show_default=True,
    help="On SIGTERM, how long in-flight requests may take to finish.",
)
@click.option(
    "--max-in-flight",
    default=0,
    show_default=True,
    help="Requests one replica may have at once; beyond, requests wait their turn by tenant"
    " priority and weight, up to --park-timeout (0: no limit).",
)
@click.option(
    "--affinity",
    type=click.Choice(["off", "session", "prefix"]),
    default="prefix",
    show_default=True,
    help="Which replica a request prefers: none (least in flight), the one its session went"
    " to, or the one its prompt's prefix went to (a model's spec may override it).",
)
@click.option(
    "--affinity-prefix-chars",
    default=4096,
    show_default=True,
    help="At most this much of the prompt's root (system prompt and first question) makes its"
    " affinity key (prefix mode).",
)
@click.option(
    "--affinity-load-factor",
    default=1.25,
    show_default=True,
    help="A preferred replica is passed over once its load exceeds this times the mean.",
)
@click.option(
    "--load-interval",
    type=click.FloatRange(min=0),
    default=0.1,
    show_default=True,
    help="How often (s) the engines' own queue and KV-cache use are read, for the replicas of"
    " models sent to in the last minute (0: never; picks use this router's own counts).",
)
@click.option(
    "--kv-threshold",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=0.8,
    show_default=True,
    help="KV-cache use at which affinity passes a replica over as full.",
)
@click.option(
    "--park-max",
    default=1000,
    show_default=True,
    help="Requests held per model while it wakes from zero (with a control plane), and per"
    " tenant and model while its replicas are saturated.",
)
@click.option(
    "--park-timeout",
    default=600.0,
    show_default=True,
    help="How long a held request waits for a replica or a slot, then 503 (engines load for"
    " minutes).",
)
@click.option(
    "--otlp-endpoint",
    default=None,
    help="Send OpenTelemetry traces here (OTLP/JSON over HTTP, e.g."
    " http://collector:4318/v1/traces). The engine gets this span as its parent (W3C"
    " traceparent).",
)
@click.option(
    "--trace-sample",
    type=click.FloatRange(0.0, 1.0),
    default=0.01,
    show_default=True,
    help="Share of requests without a traceparent that are traced (one with follows its own"
    " sampled flag).",
)
@click.option("--log-level", default="info", show_default=True)
def main(
    listen,
    backends,
    routes_file,
    control_plane,
    ca_file,
    token_file,
    api_keys_file,
    metrics_token,
    tenants_file,
    tick_s,
    workers,
    router_id,
    max_body_bytes,
    connect_timeout,
    first_byte_timeout,
    idle_timeout,
    client_timeout,
    drain_s,
    max_in_flight,
    affinity,
    affinity_prefix_chars,
    affinity_load_factor,
    load_interval,
    kv_threshold,
    park_max,
    park_timeout,
    otlp_endpoint,
    trace_sample,
    log_level,
) -> None:
    """The gpufleet data plane: an OpenAI-compatible reverse proxy in front of model replicas."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    # Under systemd, what the flags do not name comes as credentials (LoadCredential=).
    token_file = token_file or credential("router-token")
    metrics_token = metrics_token or credential_text("metrics-token") or ""
    try:
        host, port = parse_listen(listen)
        if control_plane:
            ControlPlanes(control_plane)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        routes, affinity_by_model = static_config(list(backends), routes_file)
    except (ValueError, KeyError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    if not routes and not control_plane:
        raise click.UsageError("give --backend, --routes or --control-plane")
    if routes and control_plane:
        # Static routes beside a control plane would be served, without its keys, until its
        # first table: for ever while it is down.
        raise click.UsageError("--backend and --routes are for a router without --control-plane")
    if otlp_endpoint and urlsplit(otlp_endpoint).scheme not in ("http", "https"):
        raise click.UsageError(f"--otlp-endpoint: an http(s) URL, got {otlp_endpoint!r}")
    api_keys = ()
    if api_keys_file:
        with open(api_keys_file) as f:
            api_keys = tuple(line.strip().encode() for line in f if line.strip())
    if tenants_file and control_plane:
        raise click.UsageError("--tenants-file is for a router without --control-plane")
    if tenants_file:
        try:
            read_tenants_file(tenants_file, "")
        except (ValueError, OSError) as exc:
            raise click.UsageError(str(exc)) from None
    settings = RouterSettings(
        tenants_file=tenants_file,
        host=host,
        port=port,
        static_routes=routes,
        static_affinity=affinity_by_model,
        reload_routes=None if control_plane else lambda: static_config(list(backends), routes_file),
        control_plane=control_plane,
        token=read_token(token_file),
        ca_file=ca_file,
        router_id=router_id,
        tick_s=tick_s,
        drain_s=drain_s,
        reuse_port=workers > 1,
        max_in_flight=max_in_flight,
        load_factor=affinity_load_factor,
        load_interval_s=load_interval,
        kv_threshold=kv_threshold,
        otlp_endpoint=otlp_endpoint,
        trace_sample=trace_sample,
        proxy=ProxyConfig(
            max_body_bytes=max_body_bytes,
            connect_timeout_s=connect_timeout,
            first_byte_timeout_s=first_byte_timeout,
            idle_timeout_s=idle_timeout,
            client_timeout_s=client_timeout,
            api_keys=api_keys,
            metrics_token=metrics_token.encode(),
            park_max=park_max,
            affinity=affinity,
            affinity_prefix_chars=affinity_prefix_chars,
            park_timeout_s=park_timeout,
        ),
    )
    if workers <= 1:
        sys.exit(run(settings))
    sys.exit(run_workers(settings, workers))


def run(settings: RouterSettings) -> int:
    import uvloop

    try:
        uvloop.run(RouterServer(settings).serve())
    except OSError as exc:
        logging.getLogger("gpurouter").error("cannot start: %s", exc)
        return 3
    return 0


def run_workers(settings: RouterSettings, workers: int) -> int:
    """N processes on one port (SO_REUSEPORT), each with its own table and reporter."""
    children = []
    base_id = settings.router_id
    settings.metrics_folder = tempfile.mkdtemp(prefix="gpurouter-metrics-")
    settings.workers = workers
    if settings.tenants_file:
        # A file's max_in_flight is the process's, counted by all its workers together.
        from router.tenancy.inflight import SharedInFlight

        settings.shared_in_flight = SharedInFlight(workers)
    for index in range(workers):
        pid = os.fork()
        if pid == 0:
            settings.router_id = f"{base_id}-w{index}" if base_id else ""
            settings.worker = index
            if settings.shared_in_flight is not None:
                settings.shared_in_flight.worker = index
            os._exit(run(settings))
        children.append(pid)

    def forward(signum, _frame):
        for child in children:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    running = dict.fromkeys(children)
    while running:
        child, code = os.wait()
        if child not in running:
            continue
        del running[child]
        status = status or os.waitstatus_to_exitcode(code)
        if settings.shared_in_flight is not None and running:
            # A worker gone (killed, crashed) with requests counted: they are in flight no more.
            freed = settings.shared_in_flight.reclaim(children.index(child))
            if freed:
                logging.getLogger("gpurouter").warning(
                    "worker %d ended holding %d request(s) in flight: given back",
                    children.index(child),
                    freed,
                )
    shutil.rmtree(settings.metrics_folder, ignore_errors=True)
    return status

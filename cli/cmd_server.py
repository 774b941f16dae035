"""`gpuctl server`: the control plane daemon."""

import logging
import sys

import click

from cli.listen import parse_listen
from cli.paths import default_state_path
from controlplane.api.tokens import load_tokens
from controlplane.vocabulary.credentials import credential, credential_text
from controlplane.vocabulary.specs import parse_duration


@click.command("server")
@click.option("--listen", default="127.0.0.1:8081", show_default=True)
@click.option(
    "--state",
    "state_path",
    default=None,
    help="A SQLite file (default: the user's state directory), or postgresql://USER@HOST/DB "
    "for several servers on one database, one leading.",
)
@click.option(
    "--advertise",
    default=None,
    help="The URL standbys send callers to while this server leads (default: its --listen).",
)
@click.option(
    "--lease-ttl",
    default=5.0,
    show_default=True,
    help="Seconds a leader's lease lasts unrenewed (PostgreSQL state only).",
)
@click.option(
    "--lease-renew",
    default=1.0,
    show_default=True,
    help="Seconds between a leader's renewals of its lease (PostgreSQL state only).",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    help="One token, or YAML {admin, agent, router}; none: no token needed.",
)
@click.option("--tick", "tick_s", default=1.0, show_default=True, help="Reconcile period (s).")
@click.option(
    "--node-timeout",
    default=15.0,
    show_default=True,
    help="Seconds without a heartbeat before a node is NotReady, in a fleet small enough to "
    "beat every --heartbeat seconds; a larger one's is 4 of its longer periods.",
)
@click.option(
    "--heartbeat",
    "heartbeat_s",
    default=2.0,
    show_default=True,
    help="Seconds between a node's heartbeats, handed to every agent, while the fleet is "
    "small enough for it.",
)
@click.option(
    "--max-heartbeats-per-second",
    "max_heartbeats_per_s",
    default=500.0,
    show_default=True,
    help="Heartbeats a second this server takes from the whole fleet: a larger fleet's agents "
    "are told to beat less often (nodes / this), as Nomad paces its clients.",
)
@click.option(
    "--router-live",
    default=10.0,
    show_default=True,
    help="Seconds after its last report that a router still counts as live.",
)
@click.option(
    "--min-residency",
    default="2m",
    show_default=True,
    help="How long a replica is Ready before a waiting model may take its GPUs, for specs "
    "that do not set min_residency (a duration: 90s, 2m).",
)
@click.option(
    "--room-timeout",
    default="10m",
    show_default=True,
    help="How long GPUs stay kept for a waiting model while the replicas on them stop (as "
    "long as the routers' --park-timeout), then they are given up.",
)
@click.option(
    "--rebalance/--no-rebalance",
    default=False,
    show_default=True,
    help="Move the quieter of two hot models sharing a card to a card with room and no sleepers"
    " (a cold start there, then a drain here). Off by default: on the packing bench every move"
    " measured cost more than the sharing it ended (docs/operations.md).",
)
@click.option(
    "--metrics-token",
    default=None,
    envvar="GPUFLEET_METRICS_TOKEN",
    help="A token /metrics asks for (Prometheus' authorization credentials); default: none.",
)
@click.option(
    "--auth",
    type=click.Choice(["tenants", "none"]),
    default=None,
    help="What routers ask of a request: a tenant's key, or nothing. Default: tenants once"
    " any tenant was ever applied (kept when the last one is deleted), else none.",
)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="PEM certificate.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key.")
@click.option(
    "--otlp-endpoint",
    default=None,
    help="Send OpenTelemetry traces here (OTLP over HTTP): a span per tick step that decided"
    " something and per API change (needs gpufleet[otel]).",
)
@click.option("--log-level", default="info", show_default=True)
def server(
    listen,
    state_path,
    advertise,
    lease_ttl,
    lease_renew,
    token_file,
    tick_s,
    node_timeout,
    heartbeat_s,
    max_heartbeats_per_s,
    router_live,
    min_residency,
    room_timeout,
    rebalance,
    metrics_token,
    auth,
    tls_cert,
    tls_key,
    otlp_endpoint,
    log_level,
):
    """Run the control plane: fleet state, placement, health, idle tracking, routes."""
    import uvloop

    # Here, not at the top: every gpuctl command would pay for importing the server.
    from controlplane.server import Settings, serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    host, port = parse_listen(listen)
    # Under systemd, what the flags do not name comes as credentials (LoadCredential=).
    token_file = token_file or credential("tokens")
    tls_cert, tls_key = tls_cert or credential("tls-cert"), tls_key or credential("tls-key")
    metrics_token = metrics_token or credential_text("metrics-token")
    try:
        tokens = load_tokens(token_file)
        residency_s = parse_duration(min_residency, "--min-residency", allow_zero=True)
        room_timeout_s = parse_duration(room_timeout, "--room-timeout")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if heartbeat_s <= 0 or max_heartbeats_per_s <= 0:
        raise click.UsageError("--heartbeat and --max-heartbeats-per-second must be positive")
    if node_timeout <= heartbeat_s:
        raise click.UsageError("--node-timeout must be longer than --heartbeat")
    if not 0 < lease_renew < lease_ttl:
        raise click.UsageError("--lease-renew must be shorter than --lease-ttl")
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if otlp_endpoint:
        try:
            import opentelemetry.exporter.otlp.proto.http  # noqa: F401  (only to say what is missing)
        except ImportError:
            raise click.UsageError(
                "--otlp-endpoint needs OpenTelemetry: pip install 'gpufleet[otel]'"
            ) from None
    tls = None
    if tls_cert:
        import ssl

        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            tls.load_cert_chain(tls_cert, tls_key)
        except (ssl.SSLError, OSError) as exc:
            raise click.UsageError(f"--tls-cert/--tls-key: {exc}") from None
    settings = Settings(
        host,
        port,
        state_path or str(default_state_path()),
        tokens,
        tick_s=tick_s,
        node_timeout_s=node_timeout,
        heartbeat_s=heartbeat_s,
        max_heartbeats_per_s=max_heartbeats_per_s,
        router_live_s=router_live,
        min_residency_s=residency_s,
        room_timeout_s=room_timeout_s,
        rebalance=rebalance,
        metrics_token=metrics_token,
        auth=auth,
        tls=tls,
        advertise=advertise,
        lease_ttl_s=lease_ttl,
        lease_renew_s=lease_renew,
        otlp_endpoint=otlp_endpoint,
    )
    try:
        uvloop.run(serve(settings))
    except OSError as exc:
        click.echo(f"error: cannot start the control plane: {exc}", err=True)
        sys.exit(3)

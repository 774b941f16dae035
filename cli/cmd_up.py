"""`gpuctl up`: control plane, agent, router and demo models on this machine."""

import signal
import sys
from pathlib import Path

import click

from cli.listen import parse_listen
from cli.up import AskedToStop, Console, FleetUp


@click.command("up")
@click.option(
    "--dir",
    "workdir",
    default="./.gpufleet",
    show_default=True,
    help="State, tokens and logs; re-running reuses them.",
)
@click.option(
    "--state",
    default=None,
    help="The control plane's state: a SQLite file (default: state.sqlite in --dir) or a "
    "postgresql:// URL.",
)
@click.option("--server-listen", default="127.0.0.1:8081", show_default=True)
@click.option("--router-listen", default="127.0.0.1:8080", show_default=True)
@click.option(
    "--sim-admin-listen",
    default="127.0.0.1:8082",
    show_default=True,
    help="Fault injection for the simulated fleet (gpuctl sim ...).",
)
@click.option(
    "--simulate/--detect",
    default=None,
    help="Force a simulated fleet, or use NVML's GPUs (default: NVML if it finds any).",
)
@click.option(
    "--fleet",
    "fleet_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Simulated fleet file (default: 2 fabrics, 2 GPU classes, 4 nodes).",
)
@click.option("--no-demo", is_flag=True, help="Do not apply the demo models.")
@click.option(
    "--tls",
    is_flag=True,
    help="Serve the control plane over HTTPS with a CA made in the fleet's directory; the "
    "agent, router and gpuctl trust that CA alone.",
)
@click.option(
    "--tick",
    "tick_s",
    default=2.0,
    show_default=True,
    help="The router's activity report period (s).",
)
@click.option(
    "--otlp-endpoint",
    default=None,
    help="Send traces (OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/traces) from the control plane, "
    "the router and the demo engines; needs gpufleet[otel].",
)
@click.option(
    "--trace-sample",
    type=click.FloatRange(0, 1),
    default=0.01,
    show_default=True,
    help="Share of requests without a client's traceparent that the router traces.",
)
def up(
    workdir,
    state,
    server_listen,
    router_listen,
    sim_admin_listen,
    simulate,
    fleet_file,
    no_demo,
    tls,
    tick_s,
    otlp_endpoint,
    trace_sample,
):
    """Run a whole fleet on this machine until Ctrl-C."""
    echo = Console()
    fleet = FleetUp(
        Path(workdir),
        parse_listen(server_listen),
        parse_listen(router_listen),
        parse_listen(sim_admin_listen),
        simulate,
        fleet_file,
        tick_s,
        echo,
        tls,
        state,
        otlp_endpoint,
        trace_sample,
    )

    def ask_to_stop(signum, frame):
        fleet.hurry = fleet.stopping
        fleet.stopping = True

    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, ask_to_stop) for s in stop_signals}
    code = 0
    try:
        echo("gpufleet: starting")
        fleet.start()
        models = [] if no_demo else fleet.apply_demo()
        echo(fleet.banner(models))
        code = fleet.supervise()
    except AskedToStop:
        code = 0  # Ctrl-C before the fleet was all up: what started stops below
    except click.ClickException as exc:
        exc.show()
        code = 1
    finally:
        fleet.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        echo("gpufleet: stopped")
    sys.exit(code)

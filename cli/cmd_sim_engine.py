"""`gpuctl sim-engine`: a fake OpenAI-compatible engine for demos, tests and benchmarks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from sim.engine import EngineSettings


@click.command("sim-engine")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, required=True)
@click.option("--model", "models", multiple=True, required=True, help="Served model (repeatable).")
@click.option("--ttft", "ttft_s", default=0.0, show_default=True, help="Time to first token (s).")
@click.option("--tokens-per-s", default=0.0, show_default=True, help="0: as fast as possible.")
@click.option("--output-tokens", default=16, show_default=True)
@click.option(
    "--cache-tokens",
    default=0,
    show_default=True,
    help="Prefix cache capacity in tokens (0: no cache).",
)
@click.option(
    "--prefill-per-token",
    "prefill_s_per_token",
    default=0.0,
    show_default=True,
    help="Seconds of time to first token per prompt token not in the cache.",
)
@click.option(
    "--startup-delay",
    "startup_s",
    default=0.0,
    show_default=True,
    help="Seconds spent 'loading weights': /health answers 503 meanwhile.",
)
@click.option(
    "--adapter", "adapters", multiple=True, help="A LoRA adapter of the first model (repeatable)."
)
@click.option("--error-rate", default=0.0, show_default=True, help="Share answered 500.")
@click.option("--hang", is_flag=True, help="Accept completions, never answer.")
@click.option(
    "--close-after-tokens",
    default=-1,
    show_default=True,
    help="Cut streams after this many tokens (-1: never).",
)
@click.option("--unhealthy", is_flag=True, help="/health answers 503.")
@click.option(
    "--sleep-delay", "sleep_s", default=0.0, show_default=True, help="Seconds to fall asleep."
)
@click.option(
    "--wake-delay", "wake_s", default=0.0, show_default=True, help="Seconds to wake from sleep."
)
@click.option(
    "--gpu-memory", "gpu_memory_mb", default=0, show_default=True, help="MiB a GPU held awake."
)
@click.option(
    "--sleep-gpu-memory",
    "sleep_gpu_memory_mb",
    default=0,
    show_default=True,
    help="MiB a GPU held asleep.",
)
@click.option(
    "--max-loras",
    default=0,
    show_default=True,
    help="LoRA adapters loaded at once through /v1/load_lora_adapter (0: no adapter API).",
)
@click.option(
    "--adapter-load-delay",
    "adapter_load_s",
    default=0.0,
    show_default=True,
    help="Seconds to load one adapter.",
)
@click.option(
    "--max-num-seqs",
    type=click.IntRange(min=0),
    default=256,
    show_default=True,
    help="Requests running at once; the rest wait in arrival order (0: no limit).",
)
@click.option(
    "--kv-blocks",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="KV-cache capacity in blocks of 16 tokens, the prefix cache's included (0: no limit).",
)
@click.option(
    "--kind",
    type=click.Choice(["vllm", "sglang", "llama.cpp"]),
    default="vllm",
    show_default=True,
    help="Whose metric names /metrics uses for the engine's queue and KV-cache use.",
)
@click.option(
    "--otlp-traces-endpoint",
    default=None,
    help="As vLLM's: a span per request, continuing the traceparent it was sent (OTLP over"
    " HTTP; needs gpufleet[otel]).",
)
@click.option(
    "--metrics-histograms",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Latency histograms /metrics carries besides the load, as a real engine's page does "
    "(40 make a page of about 80 KB, as vLLM's).",
)
@click.option(
    "--lora-resolver-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="As vLLM's filesystem LoRA resolver: a request for a model it does not serve loads the "
    "adapter in DIR/NAME (a folder with adapter_config.json) first, up to --max-loras.",
)
def sim_engine(
    host,
    port,
    models,
    ttft_s,
    tokens_per_s,
    output_tokens,
    cache_tokens,
    prefill_s_per_token,
    startup_s,
    adapters,
    error_rate,
    hang,
    close_after_tokens,
    unhealthy,
    sleep_s,
    wake_s,
    gpu_memory_mb,
    sleep_gpu_memory_mb,
    max_loras,
    adapter_load_s,
    max_num_seqs,
    kv_blocks,
    kind,
    otlp_traces_endpoint,
    metrics_histograms,
    lora_resolver_dir,
):
    """Serve MODELs like vLLM would, with simulated latency, output and faults."""
    import uvloop

    from sim.engine import serve

    uvloop.run(serve(settings_from(click.get_current_context().params), host, port))


def settings_from(params: dict) -> EngineSettings:
    # Imported here: every gpuctl command would pay for aiohttp, which the engine serves with.
    from sim.engine import EngineSettings, Faults

    faults = Faults(
        error_rate=params["error_rate"],
        hang=params["hang"],
        close_after_tokens=params["close_after_tokens"],
        unhealthy=params["unhealthy"],
    )
    return EngineSettings(
        models=list(params["models"]),
        ttft_s=params["ttft_s"],
        tokens_per_s=params["tokens_per_s"],
        output_tokens=params["output_tokens"],
        adapters=list(params["adapters"]),
        startup_s=params["startup_s"],
        cache_tokens=params["cache_tokens"],
        prefill_s_per_token=params["prefill_s_per_token"],
        faults=faults,
        sleep_s=params["sleep_s"],
        wake_s=params["wake_s"],
        gpu_memory_mb=params["gpu_memory_mb"],
        sleep_gpu_memory_mb=params["sleep_gpu_memory_mb"],
        max_loras=params["max_loras"],
        adapter_load_s=params["adapter_load_s"],
        max_num_seqs=params["max_num_seqs"],
        kv_blocks=params["kv_blocks"],
        kind=params["kind"],
        otlp_traces_endpoint=params.get("otlp_traces_endpoint"),
        metrics_histograms=params.get("metrics_histograms", 0),
        lora_resolver_dir=params.get("lora_resolver_dir"),
    )


def settings_from_args(args: list[str]) -> EngineSettings:
    """The settings `gpuctl sim-engine ARGS` would serve with, for a replica run in process
    (ValueError with click's message for arguments it refuses)."""
    try:
        with sim_engine.make_context("sim-engine", list(args)) as ctx:
            return settings_from(ctx.params)
    except click.ClickException as exc:
        raise ValueError(exc.format_message()) from None

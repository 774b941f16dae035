"""The control plane's Prometheus text, from the same snapshot as `gpuctl status`.

Every gauge is a family with labels (`state`, `model`, `gpu_class`) rather than one name per
state, so dashboards sum and filter them. Label values are escaped as the format asks.
"""

from __future__ import annotations

from controlplane.views.summary import ROUTER_STATES
from controlplane.vocabulary.histogram import SWAP_BUCKETS, WAKE_BUCKETS, Histogram

NODE_STATES = ("ready", "not_ready", "cordoned", "draining")
GPU_STATES = ("used", "free", "unavailable", "unhealthy")
NOT_PLACED = ("Stopping", "Failed")  # replicas that do not count towards what is placed


def escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def family(name: str, kind: str, help_text: str, samples) -> list[str]:
    """`samples`: (labels as a dict, value) pairs."""
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        text = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        out.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")
    return out


def model_samples(models: list[dict]) -> list[tuple[dict, int]]:
    samples = []
    for m in models:
        placed = sum(n for state, n in m["replicas_by_state"].items() if state not in NOT_PLACED)
        unplaceable = max(0, m["desired"] - placed) if m["reason"] else 0
        for state, count in (("desired", m["desired"]), ("ready", m["ready"])):
            samples.append(({"model": m["name"], "state": state}, count))
        samples.append(({"model": m["name"], "state": "unplaceable"}, unplaceable))
    return samples


def exposition(numbers: dict, models: list[dict], stats: dict) -> str:
    """`numbers`: the summary; `models`: the model rows; `stats`: the server's counters."""
    idle_by_model: dict[str, int] = {m["name"]: 0 for m in models}
    for replica in numbers["idle"]["replicas"]:
        idle_by_model[replica["model"]] = idle_by_model.get(replica["model"], 0) + replica["gpus"]
    out = family(
        "gpufleet_gpus",
        "gauge",
        "GPUs by class and state (unavailable: healthy and unheld on a node that takes no work).",
        (
            ({"gpu_class": gpu_class, "state": state}, counts[state])
            for gpu_class, counts in numbers["capacity"].items()
            for state in GPU_STATES
        ),
    )
    out += family(
        "gpufleet_nodes",
        "gauge",
        "Nodes by state (cordoned and draining count Ready and NotReady nodes alike).",
        (({"state": state}, numbers["nodes"][state]) for state in NODE_STATES),
    )
    out += family(
        "gpufleet_replicas",
        "gauge",
        "Replicas by state.",
        (({"state": s}, n) for s, n in numbers["replicas"]["by_state"].items()),
    )
    out += family(
        "gpufleet_model_replicas",
        "gauge",
        "Replicas per model: desired, ready, and those that cannot be placed.",
        model_samples(models),
    )
    scaled = [m for m in models if m.get("autoscale")]
    out += family(
        "gpufleet_model_desired_replicas",
        "gauge",
        "Replicas an autoscaled model's load asks for (within its bounds).",
        (({"model": m["name"]}, m["autoscale"]["recommended"]) for m in scaled),
    )
    out += family(
        "gpufleet_model_load",
        "gauge",
        "An autoscaled model's load: requests in flight on its replicas plus those waiting.",
        (({"model": m["name"]}, m["autoscale"]["load"]) for m in scaled),
    )
    out += family(
        "gpufleet_model_idle_gpus",
        "gauge",
        "GPUs held by a model's replicas idle past its idle_after.",
        (({"model": model}, gpus) for model, gpus in sorted(idle_by_model.items())),
    )
    out += family(
        "gpufleet_idle_gpus",
        "gauge",
        "GPUs held by replicas idle past their threshold.",
        [({}, numbers["idle"]["gpus_held"])],
    )
    out += family(
        "gpufleet_routers",
        "gauge",
        "Routers by state (silent: stopped reporting, may still serve).",
        (({"state": state}, numbers["routers"][state]) for state in ROUTER_STATES),
    )
    out += family(
        "gpufleet_unknown_replicas_by_silence",
        "gauge",
        "Replicas of unknown use: a silent router has them in its table.",
        [({}, numbers["routers"]["unknown_replicas"])],
    )
    out += family(
        "gpufleet_activity_reports_total",
        "counter",
        "Router activity reports accepted.",
        [({}, stats["activity_reports"])],
    )
    out += family(
        "gpufleet_idle_stops_total",
        "counter",
        "Replicas stopped for being idle, by who decided (idle: scale_to_zero_after).",
        (({"by": by}, stats.get("stops", {}).get(by, 0)) for by in ("idle", "operator")),
    )
    out += family(
        "gpufleet_room_stops_total",
        "counter",
        "Replicas stopped to make room for a waiting model.",
        [({}, stats.get("stops", {}).get("room", 0))],
    )
    out += family(
        "gpufleet_swaps_total",
        "counter",
        "Replicas placed on GPUs freed for them by stopping replicas nobody used, by model placed.",
        (({"model": m["name"]}, stats.get("swap_totals", {}).get(m["name"], 0)) for m in models),
    )
    out += (stats.get("swap_seconds") or Histogram(SWAP_BUCKETS)).lines(
        "gpufleet_swap_seconds",
        "From the first waiting request to the swapped-in replica Ready.",
    )
    out += family(
        "gpufleet_sleeps_total",
        "counter",
        "Engines put to sleep (asleep at last), by model.",
        (({"model": m["name"]}, stats.get("sleep_totals", {}).get(m["name"], 0)) for m in models),
    )
    out += family(
        "gpufleet_wakes_total",
        "counter",
        "Sleeping engines woken to Ready, by model.",
        (({"model": m["name"]}, stats.get("wake_totals", {}).get(m["name"], 0)) for m in models),
    )
    out += (stats.get("wake_seconds") or Histogram(WAKE_BUCKETS)).lines(
        "gpufleet_wake_seconds",
        "From telling a sleeping engine to wake to its replica Ready.",
    )
    sleepers = numbers.get("asleep", {})
    out += family(
        "gpufleet_asleep_replicas",
        "gauge",
        "Replicas whose engines sleep.",
        [({}, sleepers.get("replicas", 0))],
    )
    out += family(
        "gpufleet_asleep_memory_bytes",
        "gauge",
        "Memory sleeping engines keep: GPU memory (their reserves), host memory (level 1).",
        [
            ({"kind": "gpu"}, sleepers.get("gpu_memory_mb", 0) * 2**20),
            ({"kind": "host"}, sleepers.get("host_memory_mb", 0) * 2**20),
        ],
    )
    adapters = stats.get("adapters") or []  # only applied adapters get a label
    out += family(
        "gpufleet_adapter_loaded_replicas",
        "gauge",
        "Replicas that hold an adapter loaded, by adapter.",
        (({"adapter": a["name"], "base": a["base"]}, a["loaded"]) for a in adapters),
    )
    out += family(
        "gpufleet_adapter_loads_total",
        "counter",
        "Loads of an adapter the control plane decided, by adapter.",
        (
            ({"adapter": a["name"]}, stats.get("adapter_loads", {}).get(a["name"], 0))
            for a in adapters
        ),  # fmt: skip
    )
    out += family(
        "gpufleet_adapter_resolved_total",
        "counter",
        "Loads of an adapter an engine's resolver made on a first request a router sent it, by"
        " adapter (learnt from the engine and kept as if the control plane had placed it).",
        (
            ({"adapter": a["name"]}, stats.get("adapter_resolved", {}).get(a["name"], 0))
            for a in adapters
        ),  # fmt: skip
    )
    out += family(
        "gpufleet_adapter_unloads_total",
        "counter",
        "Unloads of an adapter the control plane decided, by adapter.",
        (
            ({"adapter": a["name"]}, stats.get("adapter_unloads", {}).get(a["name"], 0))
            for a in adapters
        ),  # fmt: skip
    )
    out += family(
        "gpufleet_adapter_waiting_requests",
        "gauge",
        "Requests routers hold for an adapter no replica serves yet.",
        (({"adapter": a["name"]}, a["waiting"]) for a in adapters),
    )
    out += family(
        "gpufleet_models_waiting_for_room",
        "gauge",
        "Models with requests waiting while room is made for them, or may be.",
        [({}, len(numbers.get("room", {}).get("waiting_for_room", {})))],
    )
    out += family(
        "gpufleet_model_waiting_requests",
        "gauge",
        "Requests routers hold for a model with no ready replica (it is waking).",
        (({"model": m}, n) for m, n in sorted(numbers.get("waiting", {}).items())),
    )
    out += family(
        "gpufleet_reconcile_ticks_total", "counter", "Reconciler ticks run.", [({}, stats["ticks"])]
    )
    out += family(
        "gpufleet_views_built_total",
        "counter",
        "Summaries and tables computed for readers; readers of one state share one.",
        [({}, stats.get("views_built", 0))],
    )
    out += family(
        "gpufleet_tenant_gpu_seconds",
        "gauge",
        "GPU-seconds charged over the last hour per tenant and model: card time split by the"
        " tokens each tenant was served each minute; idle minutes to the model's owner, else"
        " to (unallocated).",
        (
            ({"tenant": tenant, "model": model}, round(charged[0], 1))
            for (tenant, model), charged in sorted(stats.get("gpu_seconds_last_hour", {}).items())
        ),
    )
    out += family(
        "gpufleet_route_version",
        "gauge",
        "Version of the published routing table.",
        [({}, numbers["route_version"])],
    )
    return "\n".join(out) + "\n"

"""What a spec's scaling and room fields will do, in an operator's words (`apply --dry-run`)."""

from __future__ import annotations

from controlplane.rules.room import residency
from controlplane.vocabulary.model import ModelSpec
from controlplane.vocabulary.specs import format_duration as duration


def explain(spec: ModelSpec, default_residency_s: float) -> list[str]:
    lines = []
    floor = spec.floor
    if spec.autoscaled:
        lines.append(
            f"autoscales between {floor} and {spec.ceiling} replica(s), starting at"
            f" {spec.replicas}: ceil(load / {spec.target_in_flight:g}) replicas, load being the"
            " requests in flight on its replicas plus those waiting; out at once (at most"
            f" doubling a tick), in one a tick after {duration(spec.scale_down_delay_s)} lower"
        )
    if spec.target_waiting is not None:
        lines.append(
            f"also out to ceil(queued / {spec.target_waiting:g}) replicas when its engines'"
            f" own queues, as routers read them, hold more than {spec.target_waiting:g} per"
            " Ready replica"
        )
    if spec.scale_to_zero_after_s is not None and floor < spec.replicas:
        lines.append(
            f"scales from {spec.replicas} down to {floor} replica(s) after"
            f" {duration(spec.scale_to_zero_after_s)} unused; a request wakes it"
        )
    elif not spec.autoscaled:
        lines.append(f"keeps {spec.replicas} replica(s); idleness stops none")
    if floor == 0:
        lines.append("when it does not fit and nobody asks for it, it waits at zero")
    lines.append(
        f"priority {spec.priority}: with requests waiting and no free GPUs, it may take the GPUs"
        f" of idle replicas of models of priority {spec.priority} or lower"
    )
    kept = residency(spec, default_residency_s)
    source = "" if spec.min_residency_s is not None else " (the server's default)"
    if floor >= spec.replicas:
        lines.append("none of its replicas is ever taken for another model (min_replicas)")
    else:
        lines.append(
            f"min_residency {duration(kept)}{source}: once Ready, a replica of it is not taken"
            f" for another model of priority {spec.priority} or higher for {duration(kept)}"
        )
    lines += _sleep_lines(spec)
    if spec.max_adapters:
        lines.append(
            f"each replica holds up to {spec.max_adapters} LoRA adapter(s), loaded where"
            " requests wait for them; the idlest past its idle_after makes way when all are full"
        )
    if spec.adapter_resolver:
        lines.append(
            "its engines load an adapter on the first request for it: a request no holder can"
            " take at once goes to the least-loaded replica with a free adapter slot"
        )
    return lines


def _sleep_lines(spec: ModelSpec) -> list[str]:
    if spec.sleep_level is None:
        return []
    if not spec.sleeps:
        return [f"its {spec.engine} engines sleep by themselves; the next request wakes them"]
    kept = "its weights kept in host memory" if spec.sleep_level == 1 else "its weights dropped"
    when = (
        f"after {duration(spec.sleep_after_s)} unused (above min_replicas)"
        if spec.sleep_after_s is not None
        else "only to make room for another model"
    )
    return [
        f"sleeps at level {spec.sleep_level} ({kept}) {when}, and rather than stop when it"
        f" makes room; a request wakes it, within {duration(spec.wake_timeout_s)} or it is"
        " restarted cold"
    ]

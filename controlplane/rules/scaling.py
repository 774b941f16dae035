"""Acting on idle: which replicas to stop, as a pure step over one snapshot, like placement.

Only replicas whose idle state is `exact` or `at_least` past the threshold are candidates;
`unknown` never is. Never below the model's `min_replicas`. The longest idle first: sorting by
seconds puts a lower bound S ahead of an exact E only when S > E, that is when it is surely
longer; otherwise the exact one, known to be longer than S, goes first.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.vocabulary.actions import Counted, SetScaled, Withdraw
from controlplane.vocabulary.idle import IdleState
from controlplane.vocabulary.model import ReplicaState


@dataclass
class StopPlan:
    stop: list  # replicas, longest idle first
    refused: list[tuple[str, str]]  # (replica id, why not)


def plan_idle_stops(
    replicas: list,
    idle: dict,
    threshold_s: float,
    may_stop: int,
    silent_holders: dict,
    in_flight: dict | None = None,
) -> StopPlan:
    """`replicas`: one model's Ready replicas; `may_stop`: how many it can lose before reaching
    min_replicas; `silent_holders`: replica -> a silent router that has it in its table;
    `in_flight`: replica -> requests on it, summed over routers (a request in flight is a use,
    whatever a router's last-use stamp says)."""
    candidates, refused = [], []
    in_flight = in_flight or {}
    for replica in replicas:
        seconds, state = idle.get(replica.id, (-1.0, IdleState.UNKNOWN))
        if replica.state != ReplicaState.READY:
            refused.append((replica.id, f"{replica.state}, not Ready"))
        elif in_flight.get(replica.id):
            refused.append((replica.id, f"{in_flight[replica.id]} request(s) in flight"))
        elif state == IdleState.UNKNOWN:
            holder = silent_holders.get(replica.id)
            why = f"silent router {holder} may be using it" if holder else "no live router"
            refused.append((replica.id, f"use unknown: {why}"))
        elif seconds < threshold_s:
            refused.append((replica.id, f"used {round(seconds)}s ago, under {round(threshold_s)}s"))
        else:
            candidates.append(replica)
    candidates.sort(key=lambda r: (-idle[r.id][0], r.id))
    chosen = candidates[: max(0, may_stop)]
    for replica in candidates[len(chosen) :]:
        refused.append((replica.id, "min_replicas keeps it"))
    return StopPlan(chosen, refused)


def plan_stop_idle(view, models: list[str], idle_after_s: float | None) -> tuple[dict, list]:
    """What `gpuctl stop-idle` stops, the GPUs freed, and what it refused and why; and the
    actions that stop them (the executor's, as a tick's are: one stop path for every stop).
    The threshold: `idle_after_s`, else each model's scale_to_zero_after, else its idle_after."""
    stopped, refused, actions = [], [], []
    in_flight = view.idle.in_flight(view.now)
    for spec in sorted(view.specs.values(), key=lambda s: s.name):
        if models and spec.name not in models:
            continue
        threshold = idle_after_s or spec.scale_to_zero_after_s or spec.idle_after_s
        ready = [r for r in view.replicas_of(spec.name) if r.state == ReplicaState.READY]
        ids = [r.id for r in ready]
        idle = view.idle.idle_map(ids, view.now)
        desired = view.desired(spec)
        plan = plan_idle_stops(
            ready,
            idle,
            threshold,
            desired - spec.floor,
            view.idle.silent_holders(ids, view.now),
            in_flight,
        )
        for replica in plan.stop:
            seconds, state = idle[replica.id]
            stopped.append(
                {
                    "id": replica.id,
                    "model": spec.name,
                    "gpus": replica.gpu_count,
                    "idle_s": round(seconds, 1),
                    "idle_state": str(state),
                }
            )
            bound = "≥" if state == IdleState.AT_LEAST else ""
            desired -= 1
            actions += [
                SetScaled(spec.name, desired),
                Withdraw(replica.id, f"stopped by an operator, idle {bound}{round(seconds)}s"),
                Counted("operator"),
            ]
        refused += [{"id": rid, "model": spec.name, "why": why} for rid, why in plan.refused]
    outcome = {"stopped": stopped, "gpus_freed": sum(s["gpus"] for s in stopped)}
    return {**outcome, "refused": refused}, actions


def stop_idle(fleet, executor, models: list[str], idle_after_s: float | None, dry_run: bool):
    """`gpuctl stop-idle`, on an operator's word: planned over the fleet as it is now, and
    carried out by `executor` unless `dry_run`."""
    view = fleet.view()
    outcome, actions = plan_stop_idle(view, models, idle_after_s)
    if not dry_run:
        executor.apply(view, actions)
    return {"dry_run": dry_run, **outcome}

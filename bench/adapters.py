"""Hundreds of fine-tunes: as LoRA adapters on a few base replicas, or as models of their own.

    python -m bench.adapters [--adapters 200] [--cards 4] [--max-adapters 8] [--minutes 10] ...

One trace (Zipf popularity over the fine-tunes, bursty gamma arrivals; bench/multiplex.py's)
against the same cards two ways: `adapters`, one base model with a replica on each card holding
up to `--max-adapters` adapters each, loaded on demand and unloaded idlest first; and `models`,
each fine-tune a model of its own that makes room on request by stopping idle ones (a cold
start each). The control plane is the real one on a virtual clock; agents and the router are
bench/multiplex.py's models of them, with adapter loads taking `--adapter-load`. Reported per
way: requests within the TTFT SLO, p99 TTFT, loads and unloads per minute, requests that
reached a replica without their adapter (must be 0), requests lost (must be 0).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from bench.multiplex import (
    Settings,
    markdown_table,
    model_names,
    percentile,
    run,
    spec_for,
    trace,
)

BASE = "base"


def bodies_for_adapters(s: Settings, max_adapters: int, idle_after_s: float) -> list[dict]:
    base = {
        **spec_for(BASE, "pinned", s),
        "replicas": s.cards,
        "max_adapters": max_adapters,
    }
    adapters = [
        {"kind": "adapter", "name": name, "base": BASE, "source": f"s3://loras/{name}",
         "idle_after": idle_after_s}
        for name in model_names(s.models)
    ]  # fmt: skip
    return [base, *adapters]


def compare(s: Settings, max_adapters: int = 8, idle_after_s: float = 10.0) -> dict:
    requests = trace(s)
    with tempfile.TemporaryDirectory() as tmp:
        return {
            "adapters": run(
                "pinned",
                requests,
                s,
                Path(tmp),
                bodies_for_adapters(s, max_adapters, idle_after_s),
                warm=[],
            ),
            "models": run("cold", requests, s, Path(tmp), warm=[]),
        }


def table(results: dict, minutes: float) -> str:
    headers = ["way", "requests", "within SLO", "p50 TTFT s", "p99 TTFT s", "loads/min",
               "unloads/min", "cold starts", "without adapter", "lost", "refused"]  # fmt: skip
    rows = [headers]
    for way, r in results.items():
        rows.append(
            [
                way,
                str(r.requests),
                f"{100 * r.attainment:.1f}%",
                f"{percentile(r.ttft, 50):.2f}",
                f"{percentile(r.ttft, 99):.2f}",
                f"{r.loads / minutes:.1f}",
                f"{r.unloads / minutes:.1f}",
                str(r.cold_starts),
                str(r.misses),
                str(r.lost),
                str(r.refused),
            ]
        )
    return markdown_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=200)
    parser.add_argument("--cards", type=int, default=4)
    parser.add_argument("--max-adapters", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--cv", type=float, default=2.0)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--slo", type=float, default=5.0)
    parser.add_argument(
        "--idle-after", type=float, default=10.0, help="adapters' idle_after (a reload is cheap)"
    )
    args = parser.parse_args()
    s = replace(
        Settings(),
        models=args.adapters,
        cards=args.cards,
        minutes=args.minutes,
        rate=args.rate,
        cv=args.cv,
        zipf=args.zipf,
        slo_s=args.slo,
        warmup_minutes=3.0,
    )
    results = compare(s, args.max_adapters, args.idle_after)
    print(
        f"{args.adapters} fine-tunes on {args.cards} cards ({args.max_adapters} adapters a"
        f" replica), {args.minutes:g} min at {args.rate:g} req/s, CV {args.cv:g}, Zipf"
        f" {args.zipf:g}; SLO {args.slo:g} s; adapters' idle_after {args.idle_after:g} s"
    )
    print(table(results, args.minutes))


if __name__ == "__main__":
    main()

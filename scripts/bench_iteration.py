"""Iteration time with verification overlapped with generation, against the sequential baseline.

    .venv/bin/python scripts/bench_iteration.py [--iterations 6] [--delay 0.01] [--workers 4] [--seed 0]

Workload: the quickstart job (32 prompts x 8 samples per iteration, 2 trainer ranks, 2 rollout
instances) with a verifier that takes `--delay` seconds per sample on `--workers` workers, run on
one embedded Ray cluster three times: `schedule.overlap: true` (each sample dispatched the moment it
arrives) with the instances refilled slot by slot (`rollout.refill: slot`, the default) and batch by
batch (`batch`), and `false` (generate all, then verify all). The first iteration of each is a
warm-up and not counted; figures are medians over the rest. The bound for the overlapped run is the
sequential run's own phases (SPEC section 1: T_iter = T_generate + T_verify + T_update + T_publish).
Dispatch overhead: time from a sample's arrival at the controller to its verification starting on a
worker, for samples that found a worker free.
Writes bench_results/bench_iteration.json.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import ray
import torch
from _bench import parser, run_silently, write
from rich.console import Console
from rich.table import Table

from rlsched.config import load_config
from rlsched.metrics.spans import SpanKind, phase_times
from rlsched.policy.routing import Refill

PHASES = ("t_generate", "t_verify", "t_verify_exposed", "t_update", "t_publish", "t_load", "t_iter")


def measure(overlap: bool, args: argparse.Namespace, refill: Refill = Refill.SLOT) -> dict[str, Any]:
    cfg = load_config(
        Path("configs/jobs/quickstart.yaml"),
        [
            f"schedule.overlap={str(overlap).lower()}",
            f"rollout.refill={refill}",
            f"verifier.delay_s={args.delay}",
            f"verifier.workers={args.workers}",
            f"run.seed={args.seed}",
        ],
    )
    controller = run_silently(cfg, args.iterations)
    counted = range(2, args.iterations + 1)
    per_it = [phase_times([s for s in controller.spans if s.iteration == it]) for it in counted]
    medians = {p: statistics.median(getattr(t, p) for t in per_it) for p in PHASES}
    medians["overlap_fraction"] = statistics.median(t.overlap_fraction for t in per_it)
    median_it = sorted(per_it, key=lambda t: t.t_iter)[len(per_it) // 2]
    delays = sorted(
        s.attrs["start_delay_s"]
        for s in controller.spans
        if s.kind is SpanKind.VERIFY
        and s.iteration in counted
        and s.attrs["attempt"] == 0
        and s.attrs["free_at_arrival"]
    )
    return {
        "phases": medians,
        "critical_path": median_it.critical_path,
        "dispatch_overhead_ms": {
            "median": 1e3 * statistics.median(delays) if delays else None,
            "p99": 1e3 * delays[int(0.99 * (len(delays) - 1))] if delays else None,
            "samples": len(delays),
        },
    }


def main() -> None:
    ap = parser(__doc__, "bench_iteration")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--delay", type=float, default=0.01)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ray.init(num_cpus=8, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False)
    try:
        results = {
            "overlapped": measure(True, args),
            "overlapped, refill batch": measure(True, args, Refill.BATCH),
            "sequential": measure(False, args),
        }
    finally:
        ray.shutdown()
    seq, ovl = results["sequential"]["phases"], results["overlapped"]["phases"]
    ratio = ovl["t_iter"] / seq["t_iter"]
    bound = seq["t_generate"] + seq["t_verify"] + seq["t_update"] + seq["t_publish"] + seq["t_load"]

    table = Table(
        title=f"iteration phases, median of {args.iterations - 1} iterations "
        f"(verifier {1e3 * args.delay:.0f} ms x 256 samples on {args.workers} workers)"
    )
    table.add_column("mode")
    for col in (*PHASES, "overlap"):
        table.add_column(col.removeprefix("t_"), justify="right")
    for mode, r in results.items():
        ph = r["phases"]
        table.add_row(mode, *(f"{ph[p]:.2f}" for p in PHASES), f"{100 * ph['overlap_fraction']:.0f}%")
    console = Console(width=150)
    console.print(table)
    console.print(
        f"t_iter overlapped / sequential: {ratio:.2f}  (sequential sum of phases, the bound: {bound:.2f} s)"
    )
    by_batch = results["overlapped, refill batch"]["phases"]
    refill_ratio = ovl["t_generate"] / by_batch["t_generate"]
    console.print(f"generation refilled by slot / by batch: {refill_ratio:.2f}")
    for mode, r in results.items():
        path = " -> ".join(f"{name} {sec:.2f}s" for name, sec in r["critical_path"])
        d = r["dispatch_overhead_ms"]
        console.print(f"{mode}: critical path {path}")
        if d["median"] is not None and mode.startswith("overlapped"):  # sequential defers by design
            console.print(
                f"{mode}: dispatch overhead (arrival -> verification start, worker free) "
                f"median {d['median']:.2f} ms, p99 {d['p99']:.2f} ms over {d['samples']} samples"
            )
    write(
        args.json,
        {
            "benchmark": "bench_iteration",
            "workload": {
                "config": "configs/jobs/quickstart.yaml",
                "verifier_delay_s": args.delay,
                "verifier_workers": args.workers,
                "iterations": args.iterations,
                "warmup": 1,
            },
            "seed": args.seed,
            "statistic": "median",
            "bound": "sequential run's sum of phases (SPEC section 1)",
            "results": {
                k: {**v, "critical_path": [list(x) for x in v["critical_path"]]} for k, v in results.items()
            },
            "t_iter_ratio_overlapped_over_sequential": round(ratio, 3),
            "t_generate_ratio_slot_over_batch": round(refill_ratio, 3),
        },
    )


if __name__ == "__main__":
    main()

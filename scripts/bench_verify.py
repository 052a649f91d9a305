"""Verification dispatch policies against each other and against a lower bound, in simulation.

    .venv/bin/python scripts/bench_verify.py [--samples 10240] [--workers 256] [--iterations 3]
                                             [--seed 0] [--json OUT]

Workload (virtual time, `rlsched.sim` running the runtime's own policies): one RL job whose batches
of `--samples` samples (groups of 8 per problem; the same problems every iteration, so a problem's
history predicts its samples) are generated on 16 instances x 32 slots (lognormal, mean 20 s, sigma
0.6) and verified on `--workers` workers, for three tail shapes of a problem's verification time:
bimodal 9:1 (1 s or 100 s, as in the SPEC), lognormal (mean 5 s, sigma 1.5) and Pareto (scale 2 s,
alpha 1.5); each sample varies around its problem's time by a lognormal factor (sigma 0.2).
Policies: the sequential baseline (verify after generation, fifo), `fifo`, `sjf`, `lrpt`, `distrs`,
and `distrs` with history-based pool scaling. A second workload puts two jobs on one pool (a 64-GPU
and a 16-GPU training group, bimodal; an eighth of the samples per job on a quarter of the workers)
to count deadline misses.

The bound, per batch: `max(max_i(a_i + s_i), max_t (t + sum_{a_i >= t} s_i) / W)` (the slowest
sample from its arrival, and the work arriving from any time on spread over W workers: the whole
pool for one job, an equal share of it for two), measured from the start of the iteration. Reported
per policy, as means over iterations: batch completion / bound, the exposed verification tail after
generation ends, worker-seconds held by the pool, the training groups' idle device-seconds (trainer
devices x exposed tail, summed over jobs), and the share of batches that miss a deadline of 1.1x
their bound. Writes bench_results/bench_verify.json; scripts/bench_verify_ray.py runs the same
comparison on the real Ray pool.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlsched.config import ScenarioConfig
from rlsched.metrics.spans import Span, verification_batch
from rlsched.policy.verify import DispatchPolicy
from rlsched.sim.rljob import SimRun, simulate

SHAPES: dict[str, Any] = {
    "bimodal": {"kind": "mixture", "components": [{"weight": 9, "dist": 1.0}, {"weight": 1, "dist": 100.0}]},
    "lognormal": {"kind": "lognormal", "mean": 5.0, "sigma": 1.5},
    "pareto": {"kind": "pareto", "scale": 2.0, "shape": 1.5},
}
ARMS = ("sequential", "fifo", "sjf", "lrpt", "distrs", "distrs+scaling")
DEADLINE_FACTOR = 1.1


def _job(name: str, args: argparse.Namespace, shape: Any, overlap: bool, trainer_gpus: int) -> dict[str, Any]:
    return {
        "name": name,
        "iterations": args.iterations,
        "samples": args.samples,
        "group_size": 8,
        "problems": args.samples // 8,
        "instances": 16,
        "slots": 32,
        "trainer_gpus": trainer_gpus,
        "generate_s": {"kind": "lognormal", "mean": 20.0, "sigma": 0.6},
        "verify_cpu_s": shape,
        "verify_spread": 0.2,
        "update_s": 30,
        "publish_s": 5,
        "overlap": overlap,
    }


def scenario(args: argparse.Namespace, shape: Any, arm: str, jobs: int = 1) -> ScenarioConfig:
    specs = [("job", 64), ("small", 16)][:jobs]
    return ScenarioConfig.model_validate(
        {
            "cluster": {"gpus": 1024, "cpus": args.workers},
            "pool": {
                "cpu_workers": args.workers,
                "autoscale": arm == "distrs+scaling",
                "scale_interval_s": 5,
            },
            "jobs": [_job(n, args, shape, arm != "sequential", g) for n, g in specs],
        }
    )


def policy_of(arm: str) -> DispatchPolicy:
    return DispatchPolicy.FIFO if arm == "sequential" else DispatchPolicy(arm.removesuffix("+scaling"))


def batches(run: SimRun, workers: int, devices: dict[str, int]) -> list[dict[str, float]]:
    """Per job and iteration: completion, bound, exposed tail and the group's idle device-seconds."""
    out = []
    by_batch: dict[tuple[str, int], list[Span]] = {}
    for s in run.spans:
        by_batch.setdefault((s.attrs["job"], s.iteration), []).append(s)
    for (job, _), spans in by_batch.items():
        b = verification_batch(spans, workers)
        out.append(
            {
                "completion": b.completion,
                "bound": b.bound,
                "exposed": b.exposed,
                "idle": devices[job] * b.exposed,
            }
        )
    return out


def measure(args: argparse.Namespace, shape: Any, arm: str, jobs: int) -> dict[str, float]:
    start = time.perf_counter()
    cfg = scenario(args, shape, arm, jobs)
    run = simulate(cfg, args.seed, policy_of(arm))
    rows = batches(run, args.workers // jobs, {j.name: j.trainer_gpus for j in cfg.jobs})
    return {
        "ratio": statistics.mean(r["completion"] / r["bound"] for r in rows),
        "exposed_s": statistics.mean(r["exposed"] for r in rows),
        "worker_s": run.worker_s["cpu"],
        "idle_device_s": sum(r["idle"] for r in rows) / args.iterations,
        "misses": sum(r["completion"] > DEADLINE_FACTOR * r["bound"] for r in rows) / len(rows),
        "wall_s": time.perf_counter() - start,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10240)
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=Path("bench_results/bench_verify.json"))
    args = ap.parse_args()
    console = Console(width=120)
    results: dict[str, dict[str, dict[str, float]]] = {}
    # two jobs at an eighth of the scale: with two batches queued, distrs asks `decide` with the whole
    # queue on every dispatch (its order then moves with the clock), O(queue) per decision
    small = argparse.Namespace(**(vars(args) | {"samples": args.samples // 8, "workers": args.workers // 4}))
    workloads = [(n, s, 1, args) for n, s in SHAPES.items()]
    workloads.append(("two jobs, bimodal", SHAPES["bimodal"], 2, small))
    for label, shape, jobs, scale in workloads:
        results[label] = {}
        for arm in ARMS:
            results[label][arm] = measure(scale, shape, arm, jobs)
            console.print(f"{label:18} {arm:15} {results[label][arm]['wall_s']:6.1f} s wall", highlight=False)
    table = Table(
        title=f"verification dispatch in simulation: {args.samples} samples/batch, {args.workers} workers"
    )
    for col in (
        "workload",
        "policy",
        "completion / bound",
        "exposed tail (s)",
        "worker-s",
        "idle device-s/iter",
        "deadline misses",
    ):
        table.add_column(col, justify="right" if col != "workload" else "left")
    for label, arms in results.items():
        for arm, r in arms.items():
            table.add_row(
                label,
                arm,
                f"{r['ratio']:.3f}",
                f"{r['exposed_s']:.1f}",
                f"{r['worker_s']:,.0f}",
                f"{r['idle_device_s']:,.0f}",
                f"{100 * r['misses']:.0f}%",
            )
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "benchmark": "bench_verify",
                "mode": "simulation",
                "seed": args.seed,
                "workload": vars(args) | {"json": str(args.json), "shapes": SHAPES},
                "bound": "max(max_i(a_i + s_i), max_t t + sum_{a_i >= t} s_i / W), per batch",
                "deadline": f"{DEADLINE_FACTOR} x bound",
                "results": results,
            },
            indent=1,
        )
    )
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""Verification dispatch policies on the real Ray pool, against the same lower bound as in simulation.

    .venv/bin/python scripts/bench_verify_ray.py [--iterations 3] [--workers 4] [--prompts 36] [--seed 0]

Workload: the RL job on an embedded Ray cluster (1 trainer rank, 2 rollout instances, `--workers`
verifier workers) on a task file written for the run: 36 addition problems, each carrying a
verification time drawn once from a tail shape (bimodal 9:1 of 0.02 s and 1 s; lognormal mean 0.1 s,
sigma 1.5; Pareto scale 0.04 s, alpha 1.5; capped at 3 s), which the `synthetic` verifier spends
asleep before judging the answer (asleep, not busy: four busy workers on a 2-core machine would
stretch each other's times and the generation's). Every iteration asks for all 36 problems x 8
samples (288), so from the second iteration on each problem's history predicts its samples. Arms:
the sequential baseline, fifo, sjf, lrpt, distrs by dispatch alone (`verifier.order_generation`
off), distrs; one fresh job per arm and shape, one Ray session. Figures per arm, mean over
iterations 2..N: batch completion in seconds from the iteration's start and divided by the bound
(as in bench_verify.py, `rlsched.policy.queueing.arrival_aware_bound` over the measured arrivals and
verification times), the exposed tail after generation ends, and worker-seconds busy. Writes
bench_results/bench_verify_ray.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from _bench import parser, run_silently, write
from pydantic import TypeAdapter
from rich.console import Console
from rich.table import Table

from rlsched.config import load_config
from rlsched.metrics.spans import verification_batch
from rlsched.sim.dists import Distribution, draw

SHAPES: dict[str, Any] = {
    "bimodal": {"kind": "mixture", "components": [{"weight": 9, "dist": 0.02}, {"weight": 1, "dist": 1.0}]},
    "lognormal": {"kind": "lognormal", "mean": 0.1, "sigma": 1.5},
    "pareto": {"kind": "pareto", "scale": 0.04, "shape": 1.5},
}
ARMS = ("sequential", "fifo", "sjf", "lrpt", "distrs (dispatch only)", "distrs")
CAP_S = 3.0


def task_file(directory: Path, shape: Any, problems: int, seed: int) -> Path:
    rng = random.Random(seed)
    seconds = draw(TypeAdapter(Distribution).validate_python(shape), np.random.default_rng(seed), problems)
    lines = []
    for k in range(problems + 16):  # and 16 held-out lines, the fewest an eval takes
        a, b = rng.randrange(100, 1000), rng.randrange(100, 1000)
        answer = str(a + b)[::-1]  # the task's format: digits least significant first
        spend = float(min(seconds[k % problems], CAP_S))
        split = "train" if k < problems else "eval"
        reference = json.dumps({"answer": answer, "seconds": round(spend, 4), "burn": False})
        lines.append(
            json.dumps({"id": f"p{k}", "prompt": f"{a}+{b}", "reference": reference, "split": split})
        )
    path = directory / f"task-{seed}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def measure(path: Path, arm: str, args: argparse.Namespace) -> dict[str, float]:
    policy = "fifo" if arm == "sequential" else arm.split()[0]
    cfg = load_config(
        None,
        [
            "task.name=jsonl",
            f"task.path={path}",
            "verifier.kind=synthetic",
            f"verifier.workers={args.workers}",
            f"verifier.dispatch={policy}",
            f"verifier.order_generation={str(arm != 'distrs (dispatch only)').lower()}",
            f"schedule.overlap={str(arm != 'sequential').lower()}",
            f"grpo.prompts_per_step={args.prompts}",
            "trainer.ranks=1",
            "eval.curve_size=16",
            "task.eval_size=16",
            f"run.seed={args.seed}",
        ],
    )
    controller = run_silently(cfg, args.iterations)
    rows = []
    for it in range(2, args.iterations + 1):
        b = verification_batch([s for s in controller.spans if s.iteration == it], args.workers)
        rows.append((b.completion, b.completion / b.bound, b.exposed, b.busy))
    return {
        "completion_s": statistics.mean(r[0] for r in rows),
        "ratio": statistics.mean(r[1] for r in rows),
        "exposed_s": statistics.mean(r[2] for r in rows),
        "busy_s": statistics.mean(r[3] for r in rows),
    }


def main() -> None:
    ap = parser(__doc__, "bench_verify_ray")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument(
        "--prompts", type=int, default=36, help="problems in the task file, all asked every iteration"
    )
    args = ap.parse_args()
    console = Console(width=140)
    torch.set_num_threads(1)
    ray.init(num_cpus=8, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False)
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for shape_name, shape in SHAPES.items():
                path = task_file(Path(tmp), shape, args.prompts, args.seed)
                results[shape_name] = {}
                for arm in ARMS:
                    start = time.perf_counter()
                    results[shape_name][arm] = measure(path, arm, args)
                    wall = time.perf_counter() - start
                    console.print(f"{shape_name:10} {arm:22} {wall:6.1f} s wall", highlight=False)
    finally:
        ray.shutdown()
    table = Table(
        title=f"verification dispatch on the Ray pool: {args.prompts} x 8 samples, {args.workers} workers"
    )
    for col in (
        "shape",
        "policy",
        "completion (s)",
        "completion / bound",
        "exposed tail (s)",
        "busy worker-s",
    ):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for shape_name, arms in results.items():
        for arm, r in arms.items():
            table.add_row(
                shape_name,
                arm,
                f"{r['completion_s']:.2f}",
                f"{r['ratio']:.3f}",
                f"{r['exposed_s']:.2f}",
                f"{r['busy_s']:.1f}",
            )
    console.print(table)
    write(
        args.json,
        {
            "benchmark": "bench_verify_ray",
            "mode": "Ray",
            "seed": args.seed,
            "workload": vars(args) | {"json": str(args.json), "shapes": SHAPES, "cap_s": CAP_S},
            "bound": "rlsched.policy.queueing.arrival_aware_bound per batch, measured",
            "results": results,
        },
    )


if __name__ == "__main__":
    main()

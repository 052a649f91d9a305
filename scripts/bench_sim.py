"""Simulator speed: how long a large RL-job scenario takes in virtual time, and events per second.

    .venv/bin/python scripts/bench_sim.py [--iterations 1000] [--samples 1024] [--instances 64]
                                          [--workers 256] [--seed 0]

Workload: `--iterations` x `--samples` samples (a million by default), generation lognormal (mean
2 s, sigma 0.8) on `--instances` instances of 64 slots, verification lognormal (mean 0.5 s, sigma 1)
on `--workers` workers, FIFO dispatch through rlsched.policy.verify.decide. The bound: 60 s of wall
time for the default scenario (the simulator issue's goal). Writes bench_results/bench_sim.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rlsched.sim.rljob import simulate
from rlsched.sim.scenario import ScenarioConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_results/bench_sim.json"))
    args = ap.parse_args()
    scenario = ScenarioConfig.model_validate(
        {
            "cluster": {"gpus": args.instances + 64, "cpus": args.workers},
            "pool": {"cpu_workers": args.workers},
            "jobs": [
                {
                    "name": "bench",
                    "iterations": args.iterations,
                    "samples": args.samples,
                    "instances": args.instances,
                    "slots": 64,
                    "trainer_gpus": 64,
                    "generate_s": {"kind": "lognormal", "mean": 2.0, "sigma": 0.8},
                    "verify_cpu_s": {"kind": "lognormal", "mean": 0.5, "sigma": 1.0},
                    "update_s": 5.0,
                    "publish_s": 1.0,
                }
            ],
        }
    )
    start = time.perf_counter()
    run = simulate(scenario, args.seed)
    wall = time.perf_counter() - start
    samples = args.iterations * args.samples
    print(
        f"{samples:,} samples, {run.events:,} events in {wall:.1f} s: {run.events / wall:,.0f} events/s, "
        f"{samples / wall:,.0f} samples/s; bound 60 s -> {wall / 60:.2f} of it"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "bench_sim",
                "seed": args.seed,
                "bound": "60 s wall for 1,000 x 1,024 samples",
                "workload": vars(args) | {"out": str(args.out)},
                "samples": samples,
                "events": run.events,
                "wall_s": round(wall, 2),
                "events_per_s": round(run.events / wall),
                "ratio_to_bound": round(wall / 60, 3),
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Simulator speed: how long a large RL-job scenario takes in virtual time, and events per second.

    .venv/bin/python scripts/bench_sim.py [--iterations 1000] [--samples 1024] [--instances 64]
                                          [--workers 256] [--seed 0]

Workload: `--iterations` x `--samples` samples (a million by default), generation lognormal (mean
2 s, sigma 0.8) on `--instances` instances of 64 slots, verification lognormal (mean 0.5 s, sigma 1)
on `--workers` workers, FIFO dispatch through rlsched.policy.verify.decide. The bound: 60 s of wall
time for the default scenario (the simulator issue's goal). Writes bench_results/bench_sim.json.
"""

from __future__ import annotations

import time

from _bench import parser, table, write

from rlsched.sim.jobs import simulate
from rlsched.sim.scenario import ScenarioConfig


def main() -> None:
    ap = parser(__doc__, "bench_sim")
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--workers", type=int, default=256)
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
    table(
        f"the simulator on {samples:,} samples (seed {args.seed})",
        ["samples", "events", "wall s", "events/s", "samples/s", "of the 60 s bound"],
        [
            [
                f"{samples:,}",
                f"{run.events:,}",
                f"{wall:.1f}",
                f"{run.events / wall:,.0f}",
                f"{samples / wall:,.0f}",
                f"{wall / 60:.2f}",
            ]
        ],
    )
    write(
        args.json,
        {
            "benchmark": "bench_sim",
            "seed": args.seed,
            "bound": "60 s wall for 1,000 x 1,024 samples",
            "workload": vars(args) | {"json": str(args.json)},
            "samples": samples,
            "events": run.events,
            "wall_s": round(wall, 2),
            "events_per_s": round(run.events / wall),
            "samples_per_s": round(samples / wall),
            "ratio_to_bound": round(wall / 60, 3),
        },
    )


if __name__ == "__main__":
    main()

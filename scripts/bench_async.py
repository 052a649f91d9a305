"""Asynchronous RL in the simulator: `sync` against `async` with max_staleness k = 1, 2, 4, through the
pipeline core the runtime drives (`rlsched.core.pipeline`, `rlsched.sim.rljob`).

    .venv/bin/python scripts/bench_async.py [--seeds 3] [--iterations 40] [--seed 0]

Workloads:
- `spec-example`: SPEC section 1's pipelined example, every phase constant: generate 1 s (64 samples,
  all at once), verification 0.2 s after the last sample, update 0.8 s, publish 0.1 s, load 0.3 s.
  In sequence 2.4 s; with k = 1 the bound is 1.3 s.
- `balanced`: generation about equal to update + publish, with the long tail of real generation:
  256 samples (32 groups of 8) on 8 instances of 32 slots, tokens lognormal (mean 300, sigma 0.25)
  at 100 tokens/s (a wave takes about 5.9 s), verification lognormal (mean 0.3 s, sigma 0.8) on 32
  workers, update 5.0 s, publish 0.2 s, a 2 GB version over a 100 Gbit/s egress to 25 Gbit/s
  receivers, loaded in 0.5 s.

Each row: the steady-state t_iter (median of the gaps between commits after the first quarter of the
iterations, median over seeds), samples trained per second, and the bound it is compared with:
SPEC section 1's `max(T_generate + T_load, T_update + T_publish, T_verify_exposed, chain / (k + 1))`
(`rlsched.policy.iteration.pipelined_bound`) over the phase times of the same seed's `sync` run.
Efficiency = bound / measured (goal at least 0.85); speed-up = samples per second over `sync`'s
(goal at least 1.5x on the balanced job). An efficiency above 1 is real: an instance done with
its part of a wave starts on the next one while others finish theirs, and the bound charges the
instances with the whole wave's span. Also the samples dropped as too stale and the staleness
histogram of the samples trained. Writes bench_results/bench_async.json.
"""

from __future__ import annotations

import statistics
from itertools import pairwise
from typing import Any

from _bench import parser, table, write

from rlsched.metrics.spans import Span, SpanKind, phase_times
from rlsched.policy.iteration import pipelined_bound
from rlsched.sim.jobs import simulate
from rlsched.sim.rljob import SimRun
from rlsched.sim.scenario import ScenarioConfig


def _const(value: float) -> dict[str, Any]:
    return {"kind": "constant", "value": value}


WORKLOADS: dict[str, dict[str, Any]] = {
    "spec-example": {
        "cluster": {"gpus": 16, "cpus": 64},
        "pool": {"cpu_workers": 64},
        "job": {
            "samples": 64,
            "group_size": 8,
            "instances": 4,
            "slots": 16,
            "tokens": _const(100),
            "tokens_per_s": _const(100),
            "verify_cpu_s": _const(0.2),
            "update_s": _const(0.8),
            "publish_s": _const(0.1),
            "weights": {"bytes": 1e6, "egress_gbps": 1000, "receiver_gbps": 1000, "load_s": 0.3},
        },
    },
    "balanced": {
        "cluster": {"gpus": 16, "cpus": 32},
        "pool": {"cpu_workers": 32},
        "job": {
            "samples": 256,
            "group_size": 8,
            "instances": 8,
            "slots": 32,
            "tokens": {"kind": "lognormal", "mean": 300, "sigma": 0.25},
            "tokens_per_s": _const(100),
            "verify_cpu_s": {"kind": "lognormal", "mean": 0.3, "sigma": 0.8},
            "update_s": _const(5.0),
            "publish_s": _const(0.2),
            "weights": {"bytes": 2e9, "egress_gbps": 100, "receiver_gbps": 25, "load_s": 0.5},
        },
    },
}
MODES = (("sync", 0), ("async", 1), ("async", 2), ("async", 4))


def scenario(workload: str, mode: str, k: int, iterations: int) -> ScenarioConfig:
    w = WORKLOADS[workload]
    job = {"name": workload, "iterations": iterations, "mode": mode, "max_staleness": k, **w["job"]}
    return ScenarioConfig.model_validate({"cluster": w["cluster"], "pool": w["pool"], "jobs": [job]})


def steady(run: SimRun, iterations: int) -> float:
    """The median gap between commits after the first quarter of the iterations."""
    ends = sorted(s.end for s in run.spans if s.kind is SpanKind.ITERATION)
    gaps = [b - a for a, b in pairwise(ends)][iterations // 4 :]
    return statistics.median(gaps)


def sync_phases(run: SimRun, iterations: int) -> dict[str, float]:
    """Median phase times of a sync run's steady-state iterations (the bound's inputs)."""
    by_iteration: dict[int, list[Span]] = {}
    for s in run.spans:
        by_iteration.setdefault(s.iteration, []).append(s)
    times = [phase_times(by_iteration[i]) for i in range(iterations // 4 + 1, iterations + 1)]
    return {
        "generate": statistics.median(t.t_generate for t in times),
        "verify_exposed": statistics.median(t.t_verify_exposed for t in times),
        "update": statistics.median(t.t_update for t in times),
        "publish": statistics.median(t.t_publish for t in times),
        "load": statistics.median(t.t_load for t in times),
    }


def measure(workload: str, seeds: range, iterations: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    samples = WORKLOADS[workload]["job"]["samples"]
    per_seed: dict[int, dict[str, float]] = {}
    for mode, k in MODES:
        t_iters, bounds, dropped, histogram = [], [], 0, {}
        for seed in seeds:
            run = simulate(scenario(workload, mode, k, iterations), seed)
            if mode == "sync":
                per_seed[seed] = sync_phases(run, iterations)
            t_iters.append(steady(run, iterations))
            bounds.append(pipelined_bound(**per_seed[seed], staleness=k).bound)
            dropped += run.dropped.get(workload, 0)
            for stale, count in run.staleness.get(workload, {}).items():
                histogram[stale] = histogram.get(stale, 0) + count
        t_iter, bound = statistics.median(t_iters), statistics.median(bounds)
        rows.append(
            {
                "workload": workload,
                "mode": mode if mode == "sync" else f"async k={k}",
                "max_staleness": k,
                "t_iter_s": round(t_iter, 4),
                "t_iter_per_seed": [round(t, 4) for t in t_iters],
                "samples_per_s": round(samples / t_iter, 2),
                "bound_s": round(bound, 4),
                "efficiency": round(bound / t_iter, 3),
                "dropped_samples": dropped,
                "staleness_histogram": dict(sorted(histogram.items())),
                "phases_of_sync": {s: {k2: round(v, 4) for k2, v in p.items()} for s, p in per_seed.items()},
            }
        )
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup"] = round(r["samples_per_s"] / base, 3)
    return rows


def main() -> None:
    ap = parser(__doc__, "bench_async")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=40)
    args = ap.parse_args()
    seeds = range(args.seed, args.seed + args.seeds)
    rows = [r for w in WORKLOADS for r in measure(w, seeds, args.iterations)]
    table(
        f"async RL in the simulator ({args.seeds} seeds from {args.seed}, {args.iterations} iterations)",
        [
            "workload",
            "mode",
            "t_iter s",
            "samples/s",
            "speed-up",
            "bound s",
            "efficiency",
            "dropped",
            "staleness",
        ],
        [
            [
                r["workload"],
                r["mode"],
                f"{r['t_iter_s']:.3f}",
                f"{r['samples_per_s']:.1f}",
                f"{r['speedup']:.2f}x",
                f"{r['bound_s']:.3f}",
                f"{r['efficiency']:.2f}",
                r["dropped_samples"],
                " ".join(f"{s}:{n}" for s, n in r["staleness_histogram"].items()) or "-",
            ]
            for r in rows
        ],
        width=150,
    )
    write(
        args.json,
        {
            "benchmark": "bench_async",
            "seed": args.seed,
            "seeds": args.seeds,
            "iterations": args.iterations,
            "bound": "SPEC section 1's pipelined bound over the same seed's sync phase times; "
            "goals: efficiency >= 0.85, balanced speed-up >= 1.5x",
            "workloads": WORKLOADS,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()

"""Verification dispatch policies against each other and against a lower bound, in simulation.

    .venv/bin/python scripts/bench_verify.py [--samples 10240] [--workers 256] [--iterations 5]
                                             [--refill slot|batch] [--seed 0] [--json OUT]

Workload (virtual time, `rlsched.sim` running the runtime's own policies): one RL job whose batches
of `--samples` samples (groups of 8 per problem; the same problems every iteration, so a problem's
history predicts its samples) are generated on 16 instances x 32 slots per 10,240 samples
(lognormal, mean 20 s, sigma 0.6; each instance holds 32 requests, and with `--refill slot` each
row takes the next request the moment its sample arrives: about 500 s of generation; with `batch`
an instance takes 32 more only once all of its last 32 have arrived: about 1,300 s) and verified on
`--workers` workers,
for three tail shapes of a problem's verification time: bimodal 9:1 (1 s or 100 s, as in the SPEC),
lognormal (mean 5 s, sigma 1.5) and Pareto (scale 2 s, alpha 1.5); each sample varies around its
problem's time by a lognormal factor (sigma 0.2). Policies: the sequential baseline (verify after
generation, fifo), `fifo`, `sjf`, `lrpt`, `distrs` by dispatch alone (`order_generation` off),
`distrs` (which also has each job generate the problems with the longest expected verification
first), and `distrs` with history-based pool scaling (one worker-second weighed as 0.05 of an idle
training-group device-second: a CPU core against a GPU). A second workload puts two jobs on one pool
(a 64-GPU and a 16-GPU training group, bimodal; an eighth of the samples per job, so 2 instances
each, on a quarter of the workers: the pool's load per worker is as in the one-job workload) to
count deadline misses, with one more arm there: `distrs` with preemption.

A second table runs `distrs` on each single-job shape under both refills: generation time and batch
completion, slot against batch.

The first iteration is cold (no problem has history yet); the others are warm (every problem has
been verified before, once per earlier iteration). Figures are means over the warm iterations; the
cold iteration's exposed tail is shown beside them.

The bound, per batch (`rlsched.policy.queueing.arrival_aware_bound`): the largest of `max_i(a_i +
s_i)` (the slowest sample from its arrival), `max_t (t + sum_{a_i >= t} s_i / W)` (the work arriving
from any time on, spread over all W workers of the pool, for two jobs as well: either batch could
have the whole pool) and `max_t,k (t + (k + 1) x the (kW + 1)-th longest sample arriving from t on)`
(some worker must run k + 1 of them in a row), measured from the start of the iteration, for the
arrivals the policy saw (a generation order changes them, so policies are compared by completion in
seconds as well). Reported per policy: batch completion in seconds from the iteration's start and
divided by the bound, the exposed verification tail after generation ends, worker-seconds held by
the pool over the whole run, the training groups' idle device-seconds per iteration (trainer devices
x exposed tail, summed over jobs), and the share of batches that miss their deadline: a batch is
late when its exposed tail is longer than a quarter of its generation time (the same for every
policy, unlike the bound, which moves with the arrivals). Writes
bench_results/bench_verify.json; scripts/bench_verify_ray.py runs the same comparison on the real
Ray pool.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _bench import parser, write
from rich.console import Console
from rich.table import Table

from rlsched.metrics.spans import Span, verification_batch
from rlsched.policy.routing import Refill
from rlsched.policy.verify import DispatchPolicy
from rlsched.sim.jobs import simulate
from rlsched.sim.rljob import SimRun
from rlsched.sim.scenario import ScenarioConfig, SimJobConfig

TIMEOUT = {"floor_s": 2.0, "factor": 3.0, "cap_s": 3600.0, "hard_cap_s": 3600.0}
SHAPES: dict[str, Any] = {
    "bimodal": {"kind": "mixture", "components": [{"weight": 9, "dist": 1.0}, {"weight": 1, "dist": 100.0}]},
    "lognormal": {"kind": "lognormal", "mean": 5.0, "sigma": 1.5},
    "pareto": {"kind": "pareto", "scale": 2.0, "shape": 1.5},
}
ARMS = ("sequential", "fifo", "sjf", "lrpt", "distrs (dispatch only)", "distrs", "distrs+scaling")
TWO_JOB_ARMS = (*ARMS, "distrs+preempt")  # preemption needs a second batch to take a worker from
TAIL_BUDGET = 0.25  # a batch is late when its exposed tail exceeds this share of its generation time
WORKER_COST = 0.05  # a CPU worker-second against a GPU-second of an idle training group


def _job(name: str, args: argparse.Namespace, shape: Any, overlap: bool, trainer_gpus: int) -> dict[str, Any]:
    return {
        "name": name,
        "iterations": args.iterations,
        "samples": args.samples,
        "group_size": 8,
        "problems": args.samples // 8,
        "instances": max(1, args.samples // 640),
        "slots": 32,
        "trainer_gpus": trainer_gpus,
        "generate_s": {"kind": "lognormal", "mean": 20.0, "sigma": 0.6},
        "verify_cpu_s": shape,
        "verify_spread": 0.2,
        "update_s": 30,
        "publish_s": 5,
        "overlap": overlap,
        "refill": args.refill,
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
                "worker_cost": WORKER_COST,
                "order_generation": arm != "distrs (dispatch only)",
                "preempt": arm == "distrs+preempt",
                # the runtime's adaptive timeouts, set to let every real verification finish: the
                # bimodal shape's 100 s runs pass the default 30 s cap, and a group's samples vary
                # by a lognormal factor (sigma 0.2) that 1.5 x a sibling's time would cut
                "timeout": TIMEOUT,
            },
            "jobs": [_job(n, args, shape, arm != "sequential", g) for n, g in specs],
        }
    )


def policy_of(arm: str) -> DispatchPolicy:
    return DispatchPolicy.FIFO if arm == "sequential" else DispatchPolicy(arm.split("+")[0].split()[0])


def batches(run: SimRun, workers: int, devices: dict[str, int]) -> list[dict[str, float]]:
    """Per job and iteration: completion, bound, exposed tail and the group's idle device-seconds."""
    out: list[dict[str, float]] = []
    by_batch: dict[tuple[str, int], list[Span]] = {}
    for s in run.spans:
        by_batch.setdefault((s.attrs["job"], s.iteration), []).append(s)
    for (job, iteration), spans in by_batch.items():
        b = verification_batch(spans, workers)
        out.append(
            {
                "iteration": iteration,
                "completion": b.completion,
                "bound": b.bound,
                "exposed": b.exposed,
                "idle": devices[job] * b.exposed,
            }
        )
    return out


def late(batch: dict[str, float]) -> bool:
    """Its exposed tail is longer than TAIL_BUDGET x its generation time (completion - exposed)."""
    return batch["exposed"] > TAIL_BUDGET * (batch["completion"] - batch["exposed"])


def measure(args: argparse.Namespace, shape: Any, arm: str, jobs: int) -> dict[str, float]:
    start = time.perf_counter()
    cfg = scenario(args, shape, arm, jobs)
    run = simulate(cfg, args.seed, policy_of(arm))
    rows = batches(run, args.workers, {j.name: j.trainer_gpus for j in cfg.jobs})
    warm = [r for r in rows if r["iteration"] > 1] or rows
    return {
        "completion_s": statistics.mean(r["completion"] for r in warm),
        "generation_s": statistics.mean(r["completion"] - r["exposed"] for r in warm),
        "ratio": statistics.mean(r["completion"] / r["bound"] for r in warm),
        "exposed_s": statistics.mean(r["exposed"] for r in warm),
        "exposed_cold_s": statistics.mean(r["exposed"] for r in rows if r["iteration"] == 1),
        "worker_s": run.worker_s["cpu"],
        "idle_device_s": sum(r["idle"] for r in warm) / (len(warm) / jobs),
        "misses": sum(late(r) for r in warm) / len(warm),
        "per_iteration": rows,
        "wall_s": time.perf_counter() - start,
    }


def refill_table(
    args: argparse.Namespace, results: dict[str, dict[str, dict[str, float]]], console: Console
) -> dict[str, dict[str, dict[str, float]]]:
    """`distrs` on each single-job shape under both refills (the main table's run for `--refill`)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, shape in SHAPES.items():
        out[label] = {args.refill: results[label]["distrs"]}
        for refill in Refill:
            if refill.value != args.refill:
                other = argparse.Namespace(**(vars(args) | {"refill": refill.value}))
                out[label][refill.value] = measure(other, shape, "distrs", 1)
    table = Table(title="generation refilled slot by slot against batch by batch (distrs)")
    for col in ("workload", "refill", "generation (s)", "completion (s)", "completion / bound", "vs batch"):
        table.add_column(col, justify="right" if col != "workload" else "left")
    for label, by in out.items():
        for refill in Refill:
            r = by[refill.value]
            ratio = r["completion_s"] / by[Refill.BATCH.value]["completion_s"]
            table.add_row(
                label,
                refill.value,
                f"{r['generation_s']:.1f}",
                f"{r['completion_s']:.1f}",
                f"{r['ratio']:.3f}",
                f"{ratio:.2f}x",
            )
    console.print(table)
    return out


def main() -> None:
    ap = parser(__doc__, "bench_verify")
    ap.add_argument("--samples", type=int, default=10240)
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--iterations", type=int, default=5)
    refill = SimJobConfig.model_fields["refill"].default  # the job config's default, as the runtime's
    ap.add_argument("--refill", choices=[r.value for r in Refill], default=refill.value)
    args = ap.parse_args()
    console = Console(width=170)
    results: dict[str, dict[str, dict[str, float]]] = {}
    # two jobs at an eighth of the scale: with two batches queued, distrs asks `decide` with the whole
    # queue on every dispatch (its order then moves with the clock), O(queue) per decision
    small = argparse.Namespace(**(vars(args) | {"samples": args.samples // 8, "workers": args.workers // 4}))
    workloads = [(n, s, 1, args) for n, s in SHAPES.items()]
    workloads.append(("two jobs, bimodal", SHAPES["bimodal"], 2, small))
    for label, shape, jobs, scale in workloads:
        results[label] = {}
        for arm in ARMS if jobs == 1 else TWO_JOB_ARMS:
            results[label][arm] = measure(scale, shape, arm, jobs)
            console.print(f"{label:18} {arm:22} {results[label][arm]['wall_s']:6.1f} s wall", highlight=False)
    table = Table(
        title=f"verification dispatch in simulation: {args.samples} samples/batch, {args.workers} workers"
    )
    for col in (
        "workload",
        "policy",
        "completion (s)",
        "completion / bound",
        "exposed tail (s)",
        "cold exposed (s)",
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
                f"{r['completion_s']:.1f}",
                f"{r['ratio']:.3f}",
                f"{r['exposed_s']:.1f}",
                f"{r['exposed_cold_s']:.1f}",
                f"{r['worker_s']:,.0f}",
                f"{r['idle_device_s']:,.0f}",
                f"{100 * r['misses']:.0f}%",
            )
    console.print(table)
    refills = refill_table(args, results, console)
    write(
        args.json,
        {
            "benchmark": "bench_verify",
            "mode": "simulation",
            "seed": args.seed,
            "workload": vars(args) | {"json": str(args.json), "shapes": SHAPES},
            "bound": "max(max_i(a_i + s_i), max_t t + sum_{a_i >= t} s_i / W, "
            "max_{t,k} t + (k+1) x the (kW+1)-th longest arriving from t on), per batch",
            "deadline": f"exposed tail <= {TAIL_BUDGET} x the batch's generation time",
            "worker_cost": WORKER_COST,
            "figures": "means over the warm iterations (2 on); exposed_cold_s is iteration 1",
            "results": results,
            "refills": refills,
        },
    )


if __name__ == "__main__":
    main()

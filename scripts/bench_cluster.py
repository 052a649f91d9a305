"""How fast the cluster layer decides: admission decisions per second on large clusters.

    .venv/bin/python scripts/bench_cluster.py [--nodes 1000,10000] [--pending 5000] [--seed 0] [--json OUT]

Workload: `--nodes` nodes of three types in turn (8 H100 + 112 CPU, 8 A100 + 128 CPU, 64 CPU
only), three queues in one cohort splitting the cluster's capacity (weights 1, 2, 1), three
priority classes, and `--pending` jobs (seed `--seed`): each one gang of 1-4 bundles of 1, 2, 4 or
8 devices of one type with 4 CPU per device, under a random strategy, from a random queue and
class, submitted over the last 1,000 s. One call of `rlsched.policy.admission.admit` decides every
pending job (admit, or wait with its reason); the figure is pending jobs decided per second of that
call, for DRF ordering and plain priority order (`fifo`). For scale: Kueue's published harness
admits about 43 workloads per second end to end (not the same measurement: theirs includes the
API server).

Allocation (`rlsched.sim.cluster`, seeds 0..`--seeds`-1, `--hours` of trace): 16 nodes of 8 GPUs;
training gangs (8-64 GPUs in whole nodes, mean 4 h, 0.35 per hour per team) from two teams (queues
of weight 2 and 1 in one cohort, together nominal the whole cluster), alone and with preemptible
low-priority borrowers (1-8 GPUs, mean 30 min, 40 per hour, a queue with no nominal quota), under
DRF and priority order, and without letting a gang that must borrow preempt lower-priority
borrowers (`borrow_within_cohort: false`), and with borrowers that are requeued when evicted and
resume from their last save (`rlsched submit`'s way) rather than ending. Per variant, means over
seeds: the share of GPUs allocated (until the last arrival), each class's mean and maximum wait (the
training class's bound is 12 h), preemptions, jobs left unfinished, and Jain's index over the
queues' weighted dominant shares.
The figure it is compared with: a large study of production GPU clusters saw allocation rise from
68% to 93% once preemptible low-priority work was added. Writes bench_results/bench_cluster.json.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

from _bench import parser, write
from rich.console import Console
from rich.table import Table

from rlsched.policy.admission import admit
from rlsched.policy.cluster_model import (
    AdmissionParams,
    Admit,
    ClassParams,
    ClusterSnapshot,
    PendingJob,
    QueueParams,
)
from rlsched.policy.placement import Gang, Node, Strategy, add
from rlsched.sim.cluster import ClusterSim, TraceClass, summarise, synthetic_trace

NODE_TYPES = (
    ("h100", {"H100": 8.0, "CPU": 112.0}),
    ("a100", {"A100": 8.0, "CPU": 128.0}),
    ("cpu", {"CPU": 64.0}),
)
CLASSES = {
    "online": ClassParams(1000, preemptible=False, max_wait_s=2),
    "training": ClassParams(100, grace_s=30, min_run_s=60, max_wait_s=3600),
    "batch": ClassParams(10, grace_s=10, max_wait_s=600),
}
KUEUE_WORKLOADS_PER_S = 43.0


def world(nodes: int, pending: int, seed: int, drf: bool) -> tuple[ClusterSnapshot, AdmissionParams]:
    rng = random.Random(seed)
    cluster = tuple(
        Node(f"n{i}", dict(NODE_TYPES[i % 3][1]), {"type": NODE_TYPES[i % 3][0]}) for i in range(nodes)
    )
    cap = add(*(n.capacity for n in cluster))
    queues = {
        q: QueueParams(cohort="research", weight=w, nominal={k: v / 3 for k, v in cap.items()})
        for q, w in (("a", 1.0), ("b", 2.0), ("c", 1.0))
    }
    params = AdmissionParams(CLASSES, queues, drf=drf, device_types=frozenset({"H100", "A100"}))
    jobs = []
    for i in range(pending):
        device, bundles, size = rng.choice(["H100", "A100"]), rng.randint(1, 4), rng.choice([1, 2, 4, 8])
        gang = Gang(
            tuple({device: size, "CPU": 4.0 * size} for _ in range(bundles)), rng.choice(list(Strategy))
        )
        jobs.append(
            PendingJob(
                f"job-{i}", rng.choice("abc"), rng.choice(list(CLASSES)), rng.uniform(0, 1000), (gang,)
            )
        )
    return ClusterSnapshot(cluster, (), tuple(jobs)), params


def allocation_runs(hours: float, seeds: int) -> list[dict[str, object]]:
    nodes = [Node(f"n{i}", {"GPU": 8.0, "CPU": 64.0}) for i in range(16)]
    classes = {
        "training": ClassParams(100, grace_s=60, min_run_s=1800, max_wait_s=12 * 3600),
        "batch": ClassParams(10, grace_s=30),
    }
    whole = {"GPU": 128.0, "CPU": 1024.0}
    queues = {
        "team-a": QueueParams(cohort="c", weight=2.0, nominal={k: v * 2 / 3 for k, v in whole.items()}),
        "team-b": QueueParams(cohort="c", weight=1.0, nominal={k: v / 3 for k, v in whole.items()}),
        "spot": QueueParams(cohort="c", nominal={}),
    }
    gangs = [
        TraceClass(
            "training", team, rate_per_h=0.35, devices=(8, 16, 32, 48, 64), mean_work_s=4 * 3600, sigma=0.8
        )
        for team in ("team-a", "team-b")
    ]
    borrowers = TraceClass("batch", "spot", rate_per_h=40, devices=(1, 2, 4, 8), mean_work_s=1800)
    rows: list[dict[str, object]] = []
    for label, streams, drf, within_cohort, requeue in (
        ("gangs only, drf", gangs, True, True, False),
        ("gangs + preemptible borrowers, drf", [*gangs, borrowers], True, True, False),
        ("gangs + borrowers that requeue, drf", [*gangs, borrowers], True, True, True),
        ("gangs + preemptible borrowers, priority order", [*gangs, borrowers], False, True, False),
        ("gangs + borrowers, drf, no borrowing within cohort", [*gangs, borrowers], True, False, False),
    ):
        params = AdmissionParams(classes, queues, drf=drf, borrow_within_cohort=within_cohort)
        per_seed = []
        for seed in range(seeds):
            trace = sorted(
                (
                    replace(job, requeue=requeue)
                    for k, c in enumerate(streams)
                    for job in synthetic_trace([c], hours, seed * 10 + k)
                ),
                key=lambda j: j.job.submitted,
            )
            per_seed.append(summarise(ClusterSim(nodes, params, trace, ["GPU"]).simulate()))
        keys = sorted(set().union(*per_seed))
        rows.append({"variant": label} | {k: sum(s.get(k, 0.0) for s in per_seed) / seeds for k in keys})
    return rows


def main() -> None:
    ap = parser(__doc__, "bench_cluster")
    ap.add_argument("--nodes", default="1000,10000")
    ap.add_argument("--pending", type=int, default=5000)
    ap.add_argument("--hours", type=float, default=48.0, help="hours of job trace for the allocation runs")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the allocation runs")
    args = ap.parse_args()
    console = Console(width=120)
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",") if n):
        for policy, drf in (("drf", True), ("fifo", False)):
            snap, params = world(nodes, args.pending, args.seed, drf)
            start = time.perf_counter()
            decisions = admit(snap, 1000.0, params)
            seconds = time.perf_counter() - start
            admitted = sum(isinstance(d, Admit) for d in decisions)
            rows.append(
                {
                    "nodes": nodes,
                    "pending": args.pending,
                    "policy": policy,
                    "seconds": seconds,
                    "decisions_per_s": args.pending / seconds,
                    "admitted": admitted,
                    "vs_kueue_43_per_s": args.pending / seconds / KUEUE_WORKLOADS_PER_S,
                }
            )
            console.print(
                f"{nodes} nodes, {policy}: {args.pending / seconds:,.0f} decisions/s, {admitted} admitted"
            )
    table = Table(title=f"admission: {args.pending} pending jobs, seed {args.seed}")
    for col in ("nodes", "policy", "seconds", "decisions/s", "admitted", "vs Kueue's 43/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['nodes']:,}", r["policy"], f"{r['seconds']:.2f}", f"{r['decisions_per_s']:,.0f}",
            str(r["admitted"]), f"{r['vs_kueue_43_per_s']:.1f}x",
        )  # fmt: skip
    console.print(table)
    allocation = allocation_runs(args.hours, args.seeds)
    alloc = Table(title=f"allocation over {args.hours:g} h of trace, 16 x 8 GPUs, mean of {args.seeds} seeds")
    for col in (
        "variant",
        "GPUs allocated",
        "training wait mean / max s",
        "batch wait mean / max s",
        "preemptions",
        "unfinished",
        "Jain",
    ):
        alloc.add_column(col, justify="right" if col != "variant" else "left")
    for r in allocation:
        batch = (
            f"{float(r['batch_wait_mean_s']):,.0f} / {float(r['batch_wait_max_s']):,.0f}"
            if "batch_wait_mean_s" in r
            else "-"
        )
        alloc.add_row(
            str(r["variant"]), f"{100 * float(r['allocation']):.1f}%",
            f"{float(r['training_wait_mean_s']):,.0f} / {float(r['training_wait_max_s']):,.0f}",
            batch, f"{float(r['preemptions']):.0f}", f"{float(r['unfinished']):.0f}",
            f"{float(r['jain']):.3f}",
        )  # fmt: skip
    console.print(alloc)
    console.print(
        "compare: a production study saw 68% -> 93% allocation once preemptible low-priority work was added"
    )
    write(
        args.json,
        {
            "workload": vars(args) | {"json": str(args.json)},
            "rows": rows,
            "kueue_per_s": 43,
            "allocation": allocation,
            "allocation_reference": {"without": 0.68, "with": 0.93},
        },
    )


if __name__ == "__main__":
    main()

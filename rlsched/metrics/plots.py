"""`summary.png`: reward, pass rates and phase times per iteration, from the metrics.jsonl rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PHASES = ("t_generate", "t_verify_exposed", "t_update", "t_publish", "t_load")


def summary_png(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, constrained_layout=True)
    top.plot(its, [r["reward_mean"] for r in rows], label="mean reward (sampled)", color="tab:blue")
    evals = [(r["iteration"], r["eval_pass_rate"]) for r in rows if r.get("eval_pass_rate") is not None]
    if evals:
        top.plot(*zip(*evals, strict=True), "o-", label="held-out pass rate (greedy)", color="tab:green")
    top.set_ylabel("reward / pass rate")
    top.set_ylim(0, 1.02)
    top.legend(loc="lower right")
    top.set_title(title or "rlsched run")
    bottoms = [0.0] * len(rows)
    for phase in PHASES:
        values = [r.get(phase, 0.0) for r in rows]
        bottom.bar(its, values, bottom=bottoms, label=phase.removeprefix("t_").replace("_", " "), width=0.9)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    bottom.plot(its, [r["t_iter"] for r in rows], color="black", linewidth=1, label="iteration (wall)")
    bottom.set_xlabel("iteration")
    bottom.set_ylabel("seconds")
    bottom.legend(loc="upper right", fontsize="small", ncols=3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def simulate_png(
    summary: Mapping[str, Any], seed0: Mapping[str, Sequence[Mapping[str, float]]], out: Path
) -> Path:
    """`simulate.png`: per policy and job, the mean phases stacked with the iteration time's 95%
    interval; and the first job's iteration times in seed 0 of each policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = summary["results"]
    policies = list(results)
    jobs = [j["name"] for j in summary["scenario"]["jobs"]]  # not the pools', instances' or counts' rows
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    width = min(0.35, 0.8 / len(jobs))
    stack = ("t_generate", "t_verify_exposed", "t_update", "t_publish")
    colours = dict(zip(stack, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True))
    for k, job in enumerate(jobs):
        xs = [i + k * width for i in range(len(policies))]
        bottoms = [0.0] * len(policies)
        for phase in stack:
            values = [results[p][job][phase]["mean"] for p in policies]
            label = phase.removeprefix("t_").replace("_", " ") if k == 0 else None
            left.bar(xs, values, width, bottom=bottoms, color=colours[phase], label=label, edgecolor="white")
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        t_iter = [results[p][job]["t_iter"] for p in policies]
        left.errorbar(xs, [t["mean"] for t in t_iter], [t["ci95"] for t in t_iter], fmt="k_", capsize=4)
        for x in xs:
            left.annotate(job, (x, 0), xytext=(0, -24), textcoords="offset points", ha="center", fontsize=7)
    left.set_xticks([i + (len(jobs) - 1) * width / 2 for i in range(len(policies))], policies)
    left.set_ylabel("seconds per iteration (mean)")
    left.set_title(f"phases; black: t_iter, 95% interval over {summary['seeds']} seeds")
    left.legend(fontsize="small")
    for policy, rows in seed0.items():
        right.plot([r["iteration"] for r in rows], [r["t_iter"] for r in rows], label=policy)
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set_xlabel("iteration")
    right.set_ylabel("t_iter (s)")
    right.set_title(f"{jobs[0]}, seed 0")
    right.legend(fontsize="small")
    path = out / "simulate.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cluster_png(
    run: Any, bounds: Mapping[str, float | None], bucket_s: float, title: str, path: Path, gangs: int = 16
) -> Path:
    """One cluster-scenario variant, seed 0 (`rlsched.sim.cluster.ClusterRun`): the share of devices
    each queue holds over time (stacked); each class's wait CDF against its maximum wait; and a Gantt
    strip of the `gangs` largest jobs (every stretch each ran; hatched: it ended preempted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (alloc, cdf, gantt) = plt.subplots(3, 1, figsize=(10, 10), constrained_layout=True)
    colours = {q: f"C{i}" for i, q in enumerate(run.queue_series)}  # one colour per queue, every panel
    queues = [q for q, s in run.queue_series.items() if any(s)]
    if queues:
        hours = [k * bucket_s / 3600 for k in range(max(len(run.queue_series[q]) for q in queues))]
        series = [[*run.queue_series[q], *[0.0] * (len(hours) - len(run.queue_series[q]))] for q in queues]
        alloc.stackplot(
            hours, [[100 * x for x in s] for s in series], labels=queues, colors=[colours[q] for q in queues],
            step="post",
        )  # fmt: skip
        alloc.legend(loc="upper left", fontsize="small", ncols=min(4, len(queues)))
    alloc.set_ylim(0, 100)
    alloc.set_xlabel("hours")
    alloc.set_ylabel("% of devices held")
    alloc.set_title(f"{title}: allocation over time per queue (seed 0)")
    for k, (cls, waits) in enumerate(sorted(run.waits.items())):
        xs = sorted(w / 3600 for w in waits)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        colour = f"C{k}"
        cdf.step(xs, ys, where="post", color=colour, label=f"{cls} ({len(xs)} jobs)")
        bound = bounds.get(cls)
        if bound is not None:
            cdf.axvline(bound / 3600, color=colour, linestyle="--", linewidth=1)
    cdf.set_xlabel("hours from arrival to first start (dashed: the class's maximum wait)")
    cdf.set_ylabel("share of jobs")
    cdf.set_ylim(0, 1.02)
    cdf.legend(loc="lower right", fontsize="small")
    cdf.set_title("wait CDF per class")
    sizes: dict[str, float] = {}
    for iv in run.intervals:
        sizes[iv.job] = max(sizes.get(iv.job, 0.0), iv.devices)
    largest = sorted(sizes, key=lambda j: (-sizes[j], j))[:gangs]
    row = {j: i for i, j in enumerate(largest)}
    for iv in run.intervals:
        if iv.job in row:
            gantt.barh(
                row[iv.job], (iv.end - iv.start) / 3600, left=iv.start / 3600, color=colours.get(iv.queue),
                hatch=None if iv.done else "//", edgecolor="black", linewidth=0.3,
            )  # fmt: skip
    gantt.set_yticks(range(len(largest)), [f"{j} ({sizes[j]:g})" for j in largest], fontsize=6)
    gantt.invert_yaxis()
    gantt.set_xlabel("hours")
    gantt.set_title(f"the {len(largest)} largest jobs (devices); hatched: preempted")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

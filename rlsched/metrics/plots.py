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
    jobs = [j for j in results[policies[0]] if not j.startswith("pool/") and j != "events"]
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

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

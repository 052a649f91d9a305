"""`rlsched simulate SCENARIO`: a scenario's job in virtual time, per policy and seed, summarised.

Runs `rlsched.sim` (the runtime's own policies on a virtual clock) once per dispatch policy and seed,
and reports the mean and a 95% interval over seeds (normal approximation, mean +- 1.96 s/sqrt(n)) of
the iteration time, its phases, the exposed verification tail and verifier utilisation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlsched.config import ScenarioConfig
from rlsched.metrics.spans import SpanKind, chrome_trace, phase_times
from rlsched.policy.verify import DispatchPolicy
from rlsched.sim.rljob import Dist, DistKind, RLJobModel, SimRun, simulate

FIGURES = ("t_iter", "t_generate", "t_verify", "t_verify_exposed", "t_update", "utilisation")


def model_from(cfg: ScenarioConfig, policy: DispatchPolicy) -> RLJobModel:
    j = cfg.job
    return RLJobModel(
        iterations=j.iterations,
        samples=j.samples,
        instances=j.instances,
        slots=j.slots,
        workers=j.workers,
        update_s=j.update_s,
        publish_s=j.publish_s,
        overlap=j.overlap,
        dispatch=policy,
        generate=Dist(DistKind(cfg.generate.kind), cfg.generate.a, cfg.generate.b),
        verify=Dist(DistKind(cfg.verify.kind), cfg.verify.a, cfg.verify.b),
    )


def figures(run: SimRun, workers: int) -> dict[str, float]:
    """Per-run means over iterations of each figure."""
    its = sorted({s.iteration for s in run.spans})
    times = [phase_times([s for s in run.spans if s.iteration == it]) for it in its]
    busy = sum(s.duration for s in run.spans if s.kind is SpanKind.VERIFY)
    makespan = max(s.end for s in run.spans) - min(s.start for s in run.spans)
    out = {f: sum(getattr(t, f) for t in times) / len(times) for f in FIGURES if f != "utilisation"}
    out["utilisation"] = busy / (workers * makespan) if makespan > 0 else 0.0
    return out


def interval(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, 1.96 * sd / math.sqrt(len(values))


def run_scenario(
    cfg: ScenarioConfig, policies: Sequence[DispatchPolicy], seeds: int, out: Path | None = None
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for policy in policies:
        model = model_from(cfg, policy)
        runs = [simulate(model, seed) for seed in range(seeds)]
        per_seed = [figures(r, model.workers) for r in runs]
        results[policy.value] = {
            f: dict(zip(("mean", "ci95"), interval([p[f] for p in per_seed]), strict=True)) for f in FIGURES
        } | {"events": sum(r.events for r in runs)}
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"timeline-{policy.value}-seed0.json").write_text(json.dumps(chrome_trace(runs[0].spans)))
            (out / f"decisions-{policy.value}-seed0.log").write_text("\n".join(runs[0].decisions) + "\n")
    summary = {
        "scenario": cfg.model_dump(mode="json"),
        "seeds": seeds,
        "results": results,
        "interval": "mean +- 1.96 sd / sqrt(seeds), over seeds",
    }
    if out is not None:
        (out / "simulate.json").write_text(json.dumps(summary, indent=1))
    return summary


def render(summary: dict[str, Any]) -> str:
    cols = ["policy", *FIGURES]
    lines = ["  ".join(f"{c:>16}" for c in cols)]
    for policy, figs in summary["results"].items():
        cells = [f"{policy:>16}"]
        for f in FIGURES:
            m, h = figs[f]["mean"], figs[f]["ci95"]
            cells.append(
                f"{100 * m:6.1f}% +-{100 * h:4.1f}" if f == "utilisation" else f"{m:8.3f} +-{h:6.3f}"
            )
        lines.append("  ".join(f"{c:>16}" for c in cells))
    lines.append(
        f"seconds per iteration (mean over iterations), mean and 95% interval over {summary['seeds']} seeds"
    )
    return "\n".join(lines)

"""`rlsched simulate SCENARIO`: a scenario's jobs in virtual time, per policy and seed, summarised.

Runs `rlsched.sim` (the runtime's own policies on a virtual clock) once per dispatch policy and seed,
and reports, per job, the mean and a 95% interval over seeds (normal approximation, mean +- 1.96
s/sqrt(n)) of the iteration time, its phases and the exposed verification tail, and per pool stage
the workers' utilisation. With `--out`: simulate.json, and for seed 0 of each policy a Chrome-trace
timeline, the decision log and the per-iteration phases; simulate.png compares the policies.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlsched.metrics.spans import chrome_trace, phase_times
from rlsched.policy.verify import DispatchPolicy
from rlsched.sim.jobs import simulate
from rlsched.sim.rljob import SimRun
from rlsched.sim.scenario import ScenarioConfig

PHASES = ("t_iter", "t_generate", "t_verify", "t_verify_exposed", "t_update", "t_publish", "t_load")
LIFE = ("lifetime_s", "preparing_s", "generating_s", "not_generating")


def per_iteration(run: SimRun, job: str) -> list[dict[str, float]]:
    """One row of phase times per iteration of one job."""
    spans = run.of_job(job)
    its = sorted({s.iteration for s in spans})
    rows = []
    for it in its:
        t = phase_times([s for s in spans if s.iteration == it])
        rows.append({"iteration": it} | {f: getattr(t, f) for f in PHASES})
    return rows


def figures(run: SimRun, scenario: ScenarioConfig) -> dict[str, dict[str, float]]:
    """Per job, the mean over iterations of each phase; per pool stage (`pool/cpu`), utilisation."""
    out: dict[str, dict[str, float]] = {}
    for job in scenario.jobs:
        rows = per_iteration(run, job.name)
        out[job.name] = {f: sum(r[f] for r in rows) / len(rows) for f in PHASES}
    makespan = max(s.end for s in run.spans) - min(s.start for s in run.spans)
    workers = {"cpu": scenario.pool.cpu_workers, "gpu": scenario.pool.gpu_workers}
    for stage, busy in run.busy_s.items():
        out[f"pool/{stage}"] = {"utilisation": busy / (workers[stage] * makespan) if makespan > 0 else 0.0}
    for name, life in run.instances.items():  # elastic jobs: each instance's life
        out[f"instance/{name}"] = dict(life)
    if run.instances:
        out["reclaimed"] = {"resumed": float(run.resumed), "restarted": float(run.restarted)}
    return out


def interval(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, 1.96 * sd / math.sqrt(len(values))


def _over_seeds(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    return {
        row: {
            f: dict(zip(("mean", "ci95"), interval([p[row][f] for p in per_seed]), strict=True)) for f in figs
        }
        for row, figs in per_seed[0].items()
    }


def _write_seed0(out: Path, policy: DispatchPolicy, run: SimRun, scenario: ScenarioConfig) -> None:
    (out / f"timeline-{policy.value}-seed0.json").write_text(json.dumps(chrome_trace(run.spans)))
    (out / f"decisions-{policy.value}-seed0.log").write_text("\n".join(run.decisions) + "\n")
    rows = {job.name: per_iteration(run, job.name) for job in scenario.jobs}
    (out / f"iterations-{policy.value}-seed0.json").write_text(json.dumps(rows, indent=1))


def run_scenario(
    cfg: ScenarioConfig,
    policies: Sequence[DispatchPolicy],
    seeds: int,
    out: Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    seed0: dict[str, SimRun] = {}
    for policy in policies:
        runs = []
        for seed in range(seeds):
            runs.append(simulate(cfg, seed, policy))
            if progress:
                done = f"{policy.value}: seed {seed + 1}/{seeds}, {runs[-1].events:,} events"
                print(done, file=sys.stderr, flush=True)
        results[policy.value] = _over_seeds([figures(r, cfg) for r in runs]) | {
            "events": sum(r.events for r in runs)
        }
        seed0[policy.value] = runs[0]
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            _write_seed0(out, policy, runs[0], cfg)
    summary = {
        "scenario": cfg.model_dump(mode="json"),
        "seeds": seeds,
        "results": results,
        "interval": "mean +- 1.96 sd / sqrt(seeds), over seeds",
    }
    if out is not None:
        (out / "simulate.json").write_text(json.dumps(summary, indent=1))
        from rlsched.metrics.plots import simulate_png

        simulate_png(summary, {p: per_iteration(r, cfg.jobs[0].name) for p, r in seed0.items()}, out)
    return summary


def _cell(fig: dict[str, float], percent: bool = False) -> str:
    m, h = fig["mean"], fig["ci95"]
    return f"{100 * m:.1f}±{100 * h:.1f}%" if percent else f"{m:.3f}±{h:.3f}"


def render(summary: dict[str, Any]) -> str:
    """One table: a row per policy and job, with the pool's utilisation per stage under that policy."""
    header = ["policy", "job", *PHASES, "cpu util", "gpu util"]
    rows = [header]
    for policy, results in summary["results"].items():
        util = [
            _cell(results[f"pool/{s}"]["utilisation"], True) if f"pool/{s}" in results else "-"
            for s in ("cpu", "gpu")
        ]
        for job, figs in results.items():
            if job.startswith(("pool/", "instance/")) or job in ("events", "reclaimed"):
                continue
            rows.append([policy, job, *(_cell(figs[f]) for f in PHASES), *util])
    lines = _table(rows)
    lines.append(
        f"seconds per iteration (mean over iterations); mean ± 95% interval over {summary['seeds']} seeds"
    )
    lives = [["policy", "instance", "lifetime s", "preparing s", "generating s", "not generating"]]
    for policy, results in summary["results"].items():
        for row, figs in results.items():
            if row.startswith("instance/"):
                cells = [_cell(figs[f]) for f in LIFE[:3]] + [_cell(figs["not_generating"], True)]
                lives.append([policy, row.removeprefix("instance/"), *cells])
        if "reclaimed" in results:
            r = results["reclaimed"]
            lines.append(
                f"{policy}: reclaimed samples resumed {r['resumed']['mean']:.1f}, "
                f"restarted {r['restarted']['mean']:.1f} (mean over seeds)"
            )
    if len(lives) > 1:
        lines += [
            "",
            *_table(lives),
            "each instance's life: granted to reclaimed (or the end); not generating = "
            "preparing (weights over the link, load) or idle",
        ]
    return "\n".join(lines)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]

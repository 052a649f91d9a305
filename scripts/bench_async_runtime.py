"""Asynchronous RL on the runtime: `sync` against `async` (max_staleness 1), each a real `rlsched run`
on an embedded Ray cluster, from the same seeds.

    .venv/bin/python scripts/bench_async_runtime.py [--seeds 3] [--steps 30] [--seed 0]
                                                    [--config configs/jobs/quickstart.yaml] [--set K=V ...]

On two cores the trainer's ranks and the rollout instances share the same CPUs, so overlapping them
cannot make an iteration much faster here: the wall-clock ratio is reported as it is. What the run
shows is that the pipeline is real: the trainer busy while instances generate, the idle fractions of
both (from the spans), samples trained per second, and the held-out pass rate against samples trained.

Each run's figures, over its steady state (from the commit of the first quarter's last step to the
last commit):
- `t_iter`: the median gap between commits;
- `samples/s`: samples trained (the records' `used`) per second of that window;
- trainer idle: the share of the window with no update or publish span;
- instances idle: per instance, the share with no generate call in flight (`batch` spans), averaged;
- the held-out pass rate after the run and every `eval.every_steps` (equal samples trained: the same
  steps, 256 samples each).

The goal it is compared with: async's median final pass rate within the seed-to-seed range of sync's
at equal samples trained. `async k=1` trains with the default correction (`behaviour`: PPO's clip
against the sampling version); the `decoupled` and uncorrected runs are the ablations.

A second table puts the simulator beside the runtime: the job in virtual time through the same cores
(`simulated_t_iter`), fed the first sync run's measured phases, with the CPU contention of overlapping
generation and training (how much longer generate calls and updates took in the first async run than
in the first sync run) fitted on those runs and checked on the other seeds' (goal: within 15%).
Writes bench_results/bench_async_runtime.json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

from _bench import parser, table, write

from rlsched.config import JobConfig, load_config
from rlsched.metrics.spans import Span, SpanKind, busy_fraction
from rlsched.sim.jobs import simulate
from rlsched.sim.scenario import ScenarioConfig

ROOT = Path(__file__).resolve().parents[1]
ASYNC_K1 = ["schedule.mode=async", "rollout.max_staleness=1"]
MODES: dict[str, list[str]] = {
    "sync": [],
    "async k=1": ASYNC_K1,  # grpo.correction: behaviour, the default (PPO's clip against the sampler)
    "async k=1, decoupled": [*ASYNC_K1, "grpo.correction=decoupled"],
    "async k=1, no correction": [*ASYNC_K1, "grpo.correction=none"],
}


def spans_of(trace: dict[str, Any]) -> list[Span]:
    """The run's spans back from its Chrome trace (seconds from the first span)."""
    out = []
    for e in trace["traceEvents"]:
        if e["ph"] != "X":
            continue
        attrs = {k: v for k, v in e["args"].items() if k != "iteration"}
        start = e["ts"] / 1e6
        out.append(
            Span(SpanKind(e["cat"]), e["name"], start, start + e["dur"] / 1e6, e["args"]["iteration"], attrs)
        )
    return out


def figures(out: Path, steps: int) -> dict[str, Any]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((out / "report.json").read_text())
    spans = [
        s for s in spans_of(json.loads((out / "timeline.json").read_text())) if not s.attrs.get("redone")
    ]
    commits = sorted(s.end for s in spans if s.kind is SpanKind.ITERATION)
    lo, hi = commits[max(steps // 4 - 1, 0)], commits[-1]
    gaps = [b - a for a, b in pairwise(commits)][steps // 4 :]
    trained = sum(r["used"] for r in rows if r["iteration"] > steps // 4)
    trainer = [s for s in spans if s.kind in (SpanKind.UPDATE, SpanKind.PUBLISH)]
    lanes: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        if s.kind is SpanKind.BATCH:
            lanes[str(s.attrs["lane"])].append(s)
    pulls: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        if s.kind in (SpanKind.TRANSFER, SpanKind.LOAD, SpanKind.CONFIRM) and not s.attrs.get("join"):
            pulls[s.id].append(s)
    staleness: dict[str, int] = defaultdict(int)
    for r in rows:
        for k, n in r["extra"].get("staleness", {"0": r["samples"]}).items():
            staleness[k] += n
    return {
        "t_iter_s": round(statistics.median(gaps), 4),
        "samples_per_s": round(trained / (hi - lo), 2),
        "trainer_idle": round(1 - busy_fraction(trainer, lo, hi), 3),
        "instances_idle": round(statistics.mean(1 - busy_fraction(v, lo, hi) for v in lanes.values()), 3),
        "before": report["before"]["pass_rate"],
        "after": report["after"]["pass_rate"],
        "curve": {
            r["iteration"] * r["samples"]: r["eval_pass_rate"]
            for r in rows
            if r["eval_pass_rate"] is not None
        },
        "staleness": dict(sorted(staleness.items())),
        "stale_groups_dropped": rows[-1]["extra"].get("stale_groups_dropped", 0),
        "wall_s": report.get("wall_s"),
        "phases": {  # medians of the steady state's spans: what the simulator is fed
            "batch_s": _median(s for v in lanes.values() for s in v if s.end > lo),
            "update_s": _median(s for s in spans if s.kind is SpanKind.UPDATE and s.end > lo),
            "publish_s": _median(s for s in spans if s.kind is SpanKind.PUBLISH and s.end > lo),
            "load_s": statistics.median(
                max(x.end for x in v) - min(x.start for x in v) for v in pulls.values()
            ),
            "verify_s": [round(s.duration, 5) for s in spans if s.kind is SpanKind.VERIFY][:512],
        },
    }


def _median(spans: Any) -> float:
    return statistics.median(s.duration for s in spans)


def simulated_t_iter(
    cfg: JobConfig, phases: dict[str, Any], slow: tuple[float, float], mode: str, steps: int
) -> float:
    """The job in the simulator, through the same cores: its phases as measured in a sync run, each
    generate call and pull `slow[0]` times longer and each update and publish `slow[1]` times (the
    CPU contention of running them at once, fitted on another run)."""
    gen, upd = slow
    k = cfg.rollout.max_staleness if mode == "sync" else 1
    job = {
        "iterations": steps, "samples": cfg.grpo.prompts_per_step * cfg.grpo.group_size,
        "group_size": cfg.grpo.group_size, "instances": cfg.rollout.instances,
        "slots": cfg.rollout.request_batch, "trainer_gpus": cfg.trainer.ranks,
        "tokens": {"kind": "constant", "value": 100 * phases["batch_s"] * gen},
        "tokens_per_s": {"kind": "constant", "value": 100},
        "verify_cpu_s": {"kind": "empirical", "values": phases["verify_s"]},
        "update_s": {"kind": "constant", "value": phases["update_s"] * upd},
        "publish_s": {"kind": "constant", "value": phases["publish_s"] * upd},
        "weights": {"bytes": 1e3, "egress_gbps": 1e3, "receiver_gbps": 1e3, "load_s": phases["load_s"] * gen},
        "mode": "sync" if mode == "sync" else "async", "max_staleness": k,
    }  # fmt: skip
    scenario = ScenarioConfig.model_validate(
        {
            "cluster": {"gpus": 1000, "cpus": 1000},
            "pool": {"cpu_workers": cfg.verifier.workers},
            "jobs": [job],
            "seeds": 1,
        }
    )
    sim = simulate(scenario, 0)
    commits = sorted(s.end for s in sim.spans if s.kind is SpanKind.ITERATION)
    return statistics.median([b - a for a, b in pairwise(commits)][steps // 4 :])


def sim_check(cfg: JobConfig, results: dict[str, list[dict[str, Any]]], steps: int) -> list[dict[str, Any]]:
    """The simulator against the runtime for each async run after the first: fed the first sync run's
    phases and the contention fitted on the first async run against it (never on the run checked)."""
    if "sync" not in results or "async k=1" not in results:
        return []
    base, fit = results["sync"][0]["phases"], results["async k=1"][0]["phases"]
    slow = (fit["batch_s"] / base["batch_s"], fit["update_s"] / base["update_s"])
    out = []
    for run in results["async k=1"][1:]:
        predicted = simulated_t_iter(cfg, base, slow, "async", steps)
        out.append(
            {
                "measured_s": run["t_iter_s"],
                "simulated_s": round(predicted, 4),
                "error": round(predicted / run["t_iter_s"] - 1, 4),
                "contention": [round(x, 3) for x in slow],
            }
        )
    for run in results["sync"][1:]:
        predicted = simulated_t_iter(cfg, base, (1.0, 1.0), "sync", steps)
        out.append(
            {"mode": "sync", "measured_s": run["t_iter_s"], "simulated_s": round(predicted, 4),
             "error": round(predicted / run["t_iter_s"] - 1, 4)}
        )  # fmt: skip
    return out


def run(config: str, mode: str, seed: int, steps: int, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = [
            f"run.seed={seed}",
            f"grpo.steps={steps}",
            "grpo.time_budget_s=100000",
            *MODES[mode],
            *extra,
        ]
        cmd = [sys.executable, "-m", "rlsched.cli", "run", config, "--out", tmp]
        proc = subprocess.run(
            cmd + [a for s in settings for a in ("--set", s)], capture_output=True, text=True, cwd=ROOT
        )
        if proc.returncode != 0:
            raise SystemExit(f"{mode} seed {seed} failed:\n{proc.stderr[-3000:]}")
        return figures(Path(tmp), steps)


def main() -> None:
    ap = parser(__doc__, "bench_async_runtime")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--config", default="configs/jobs/quickstart.yaml")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more settings for every run")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="sync comes first")
    args = ap.parse_args()
    seeds = list(range(args.seed, args.seed + args.seeds))
    results = {
        mode: [run(args.config, mode, s, args.steps, args.extra) for s in seeds] for mode in args.modes
    }
    sync_after = [r["after"] for r in results[args.modes[0]]]
    spread = (min(sync_after), max(sync_after))
    rows = []
    for mode, runs in results.items():
        rows.append(
            {
                "mode": mode,
                "t_iter_s": statistics.median(r["t_iter_s"] for r in runs),
                "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
                "trainer_idle": statistics.median(r["trainer_idle"] for r in runs),
                "instances_idle": statistics.median(r["instances_idle"] for r in runs),
                "after": [r["after"] for r in runs],
                "within_sync_spread": all(spread[0] <= r["after"] <= spread[1] for r in runs),
                "median_within_sync_spread": spread[0]
                <= statistics.median(r["after"] for r in runs)
                <= spread[1],
                "runs": runs,
            }
        )
    checks = sim_check(load_config(args.config, args.extra), results, args.steps)
    table(
        "the simulator against the runtime (fitted on the first seed's runs, checked on the others)",
        ["mode", "measured t_iter", "simulated", "error"],
        [
            [
                c.get("mode", "async k=1"),
                f"{c['measured_s']:.3f}",
                f"{c['simulated_s']:.3f}",
                f"{100 * c['error']:+.1f}%",
            ]
            for c in checks
        ],
    )
    base = rows[0]["samples_per_s"]
    table(
        f"{args.config}: sync vs async, {args.steps} steps, seeds {seeds} (medians over seeds)",
        [
            "mode",
            "t_iter s",
            "samples/s",
            "vs sync",
            "trainer idle",
            "instances idle",
            "pass rate after",
            "median in sync's range",
        ],
        [
            [
                r["mode"],
                f"{r['t_iter_s']:.3f}",
                f"{r['samples_per_s']:.1f}",
                f"{r['samples_per_s'] / base:.2f}x",
                f"{100 * r['trainer_idle']:.0f}%",
                f"{100 * r['instances_idle']:.0f}%",
                " ".join(f"{100 * a:.1f}%" for a in r["after"]),
                "yes" if r["median_within_sync_spread"] else "no",
            ]
            for r in rows
        ],
        width=150,
    )
    write(
        args.json,
        {
            "benchmark": "bench_async_runtime",
            "config": args.config,
            "seeds": seeds,
            "steps": args.steps,
            "settings": args.extra,
            "bound": "async's median final pass rate within sync's seed-to-seed range, equal samples trained",
            "sync_spread": spread,
            "rows": rows,
            "simulator_vs_runtime": checks,
        },
    )


if __name__ == "__main__":
    main()

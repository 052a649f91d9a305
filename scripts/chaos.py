"""The chaos soak: random faults at random points of the quickstart job, each run checked for lost or
duplicated samples, weights that disagree, a broken staleness bound, and a curve that differs from
the uninterrupted run's (`rlsched.chaos`).

    .venv/bin/python scripts/chaos.py [--seed 0] [--budget-s 1200] [--trials 0] [--faults all]

Workload: the quickstart job (6 iterations of 8 prompts x 8 samples, checkpoints every 2, uploads to
a second directory), once without faults (the reference curve), then trial after trial: a fault kind,
the iteration after which it lands and how far into the next (seeded), each in its own run (the
node and scheduler kinds on a three-node `ray.cluster_utils.Cluster` of their own, the scheduler's
with the job under it, supervised: `rlsched.chaos.cluster_trial`). It stops
after `--trials` trials (0: no limit) or once `--budget-s` seconds have passed, whichever comes
first, and after every fault kind has had at least one trial. Prints one table (trials, recovered,
problems, recovery time p50/max per kind) and writes bench_results/chaos.json.

Recovery time: from the kill until the commit log holds, for good, an iteration past the one it
held at the kill (for the driver: including `rlsched run --resume` starting a new Ray cluster).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench import parser, table, write

from rlsched.chaos import (
    CLUSTER_FAULTS,
    GROUP,
    PROMPTS,
    SETS,
    STEPS,
    Fault,
    check_run,
    cluster_trial,
    command,
    curve,
    pick,
    run_trial,
)


def _reference(root: Path, sets: list[str]) -> list[tuple[Any, ...]]:
    import subprocess

    out = root / "reference"
    proc = subprocess.run(
        [*command("configs/jobs/quickstart.yaml", sets), "--out", str(out)], capture_output=True
    )
    if proc.returncode != 0:
        sys.exit(f"the reference run failed:\n{proc.stderr.decode()[-2000:]}")
    return curve(out)


def main() -> None:
    ap = parser(__doc__, "chaos")
    ap.add_argument("--budget-s", type=float, default=1200.0, help="stop starting trials after this")
    ap.add_argument("--trials", type=int, default=0, help="at most this many trials (0: until the budget)")
    ap.add_argument("--faults", default="all", help="comma-separated fault kinds (default: all)")
    args = ap.parse_args()
    faults = list(Fault) if args.faults == "all" else [Fault(f) for f in args.faults.split(",")]
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="rlsched-chaos-") as scratch:  # gigabytes of runs: never kept
        _soak(args, faults, rng, Path(scratch))


def _soak(args: argparse.Namespace, faults: list[Fault], rng: random.Random, root: Path) -> None:
    started = time.monotonic()
    sets = [*SETS, f"checkpoint.upload_to={root / 'bucket'}"]
    reference = _reference(root, sets)
    trials: list[dict[str, Any]] = []
    untried = list(faults)
    while True:
        over = time.monotonic() - started > args.budget_s or (args.trials and len(trials) >= args.trials)
        if over and not untried:
            break
        fault, after, delay = pick(rng, faults, STEPS)
        if untried:  # every kind once first, in order
            fault = untried.pop(0)
        out = root / f"trial-{len(trials)}"
        if fault in CLUSTER_FAULTS:  # on a three-node cluster of its own
            trial = cluster_trial(fault, out, after, delay, sets)
        else:
            trial = run_trial(command("configs/jobs/quickstart.yaml", sets), out, fault, after, delay)
        problems = trial.problems + check_run(out, STEPS, PROMPTS * GROUP, reference=reference, uploaded=True)
        trials.append(
            {"fault": str(fault), "after": after, "delay_s": delay, "at_kill": trial.at_kill,
             "killed": len(trial.killed), "recovery_s": trial.recovery_s, "problems": problems}
        )  # fmt: skip
        outcome = problems or "recovered"
        print(
            f"trial {len(trials)}: {fault} after {after} +{delay}s: {outcome} ({trial.recovery_s or 0:.1f} s)"
        )
        shutil.rmtree(out, ignore_errors=True)
    rows, kinds = [], {}
    for fault in faults:
        mine = [t for t in trials if t["fault"] == str(fault)]
        times = [t["recovery_s"] for t in mine if t["recovery_s"] is not None]
        bad = [t for t in mine if t["problems"]]
        kinds[str(fault)] = {
            "trials": len(mine),
            "recovered": len(mine) - len(bad),
            "recovery_s_p50": statistics.median(times) if times else None,
            "recovery_s_max": max(times) if times else None,
        }
        p50 = f"{statistics.median(times):.1f}" if times else "-"
        rows.append(
            [
                str(fault),
                len(mine),
                len(mine) - len(bad),
                len(bad),
                p50,
                f"{max(times):.1f}" if times else "-",
            ]
        )
    columns = ["fault", "trials", "recovered", "with problems", "recovery p50 s", "recovery max s"]
    table(f"chaos soak: {len(trials)} trials, seed {args.seed}", columns, rows, width=150)
    write(
        args.json,
        {
            "workload": {"job": "configs/jobs/quickstart.yaml", "sets": SETS, "steps": STEPS},
            "seed": args.seed,
            "bound": "zero samples lost or used twice; the uninterrupted run's curve",
            "kinds": kinds,
            "trials": trials,
            "wall_s": round(time.monotonic() - started, 1),
        },
    )
    shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if any(t["problems"] for t in trials) else 0)


if __name__ == "__main__":
    main()

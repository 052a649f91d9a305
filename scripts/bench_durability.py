"""What durability costs a job: the commit of each iteration's record against the iteration's time
(goal: under 2%, the commit alone), and apart from it, each checkpoint's save time and size and its
background upload.

    .venv/bin/python scripts/bench_durability.py [--quickstart-steps 20] [--smollm2-steps 4]

Workload: `rlsched run` as a user runs it, on the embedded cluster:
- the quickstart job (`configs/jobs/quickstart.yaml`), `--quickstart-steps` iterations, a checkpoint
  every 5 and uploads to a second directory;
- SmolLM2-135M-Instruct (`configs/jobs/smollm2.yaml`, after `make model-smollm2`), `--smollm2-steps`
  iterations, a checkpoint every 2, uploads on (skipped when the import is missing).

Figures from each run's report.json (`durability`) and metrics.jsonl: medians of the commit time and
the iteration time (their ratio is the overhead), the checkpoint save time (every rank's training
state, the BF16 Hugging Face directory, checksums, fsync, rename) and bytes, the upload time, and the
durable watermark at the end. Writes bench_results/bench_durability.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import parser, table, write

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"


def _run(config: str, out: Path, sets: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "rlsched.cli", "run", config, "--out", str(out)]
    command += [a for s in sets for a in ("--set", s)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{config} failed:\n{proc.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    d = report["durability"]
    iter_s = statistics.median(r["t_iter"] for r in rows)
    return {
        "config": config,
        "sets": sets,
        "iterations": len(rows),
        "iteration_s_p50": round(iter_s, 4),
        "commit_s_p50": d["commit_s_median"],
        "commit_fraction": round(d["commit_s_median"] / iter_s, 5),
        "checkpoints": d["checkpoints"],
        "checkpoint_save_s_p50": d["checkpoint_save_s_median"],
        "checkpoint_bytes": d["checkpoint_bytes"],
        "upload_s_p50": d["upload_s_median"],
        "durable_through": d["durable_through"],
    }


def main() -> None:
    ap = parser(__doc__, "bench_durability")
    ap.add_argument("--quickstart-steps", type=int, default=20)
    ap.add_argument("--smollm2-steps", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlsched-durability-") as scratch:  # gigabytes: never kept
        runs = _runs(args, Path(scratch))
    _report(args, runs)


def _runs(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    runs = []
    quick = [f"grpo.steps={args.quickstart_steps}", "checkpoint.every=5", "eval.every_steps=10",
             f"checkpoint.upload_to={root / 'bucket-q'}", f"run.seed={args.seed}"]  # fmt: skip
    runs.append(_run("configs/jobs/quickstart.yaml", root / "quickstart", quick))
    if SMOLLM2.is_dir():
        smol = [f"grpo.steps={args.smollm2_steps}", "checkpoint.every=2", "eval.every_steps=2",
                "eval.curve_size=16", "task.eval_size=16", f"checkpoint.upload_to={root / 'bucket-s'}",
                f"run.seed={args.seed}"]  # fmt: skip
        runs.append(_run("configs/jobs/smollm2.yaml", root / "smollm2", smol))
    else:
        print(f"SmolLM2 skipped: {SMOLLM2} is missing (make model-smollm2)")
    return runs


def _report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    rows = [
        [Path(r["config"]).stem, r["iterations"], f"{r['iteration_s_p50']:.3f}",
         f"{1000 * r['commit_s_p50']:.2f}", f"{100 * r['commit_fraction']:.2f}%", r["checkpoints"],
         f"{r['checkpoint_save_s_p50']:.2f}", f"{r['checkpoint_bytes'] / 1e6:.1f}",
         f"{r['upload_s_p50']:.2f}", r["durable_through"]]
        for r in runs
    ]  # fmt: skip
    columns = ["job", "iters", "iter p50 s", "commit p50 ms", "commit/iter", "ckpts", "save p50 s", "ckpt MB",
               "upload p50 s", "durable through"]  # fmt: skip
    title = "durability: commit and checkpoint costs (goal: commit under 2% of an iteration)"
    table(title, columns, rows, width=150)
    write(
        args.json,
        {
            "workload": "rlsched run on the embedded cluster; see the docstring",
            "seed": args.seed,
            "bound": {"commit_fraction_goal": 0.02},
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()

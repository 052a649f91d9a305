"""What a job's run writes at its end and prints as it goes: `report.json` (held-out pass rate
before and after, wall time, the durability figures, the weight transfers) and each iteration's
one-line summary.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlsched.job.durability import JobLog
from rlsched.job.records import IterationRecord
from rlsched.rl.evaluate import EvalResult


@dataclass
class JobReport:
    before: EvalResult
    after: EvalResult
    iterations: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def gain_points(self) -> float:
        return 100 * (self.after.pass_rate - self.before.pass_rate)


def iteration_line(rec: IterationRecord, times: dict[str, Any]) -> str:
    ev = f"  eval {100 * rec.eval_pass_rate:5.1f}%" if rec.eval_pass_rate is not None else ""
    return (
        f"iter {rec.iteration:4d}  v{rec.version:<4d} reward {rec.reward_mean:.3f}  "
        f"gen {times['t_generate']:5.2f}s  verify-exposed {times['t_verify_exposed']:5.2f}s  "
        f"update {times['t_update']:5.2f}s  publish+load {times['t_publish'] + times['t_load']:5.2f}s  "
        f"iter {times['t_iter']:5.2f}s  overlap {100 * times['overlap_fraction']:3.0f}%{ev}"
    )


def write_report(out_dir: Path, report: JobReport, job_log: JobLog, weights: dict[str, Any]) -> None:
    figures = job_log.figures
    iter_s = [r["t_iter"] for r in report.iterations[-len(figures.commit_s) :]] if figures.commit_s else []
    durability = {
        "commit_s_median": median(figures.commit_s),
        "commit_fraction_of_iteration": (
            round(median(figures.commit_s) / median(iter_s), 5) if iter_s and median(iter_s) else None
        ),
        "checkpoints": len(figures.save_s),
        "checkpoint_save_s_median": median(figures.save_s),
        "checkpoint_bytes": figures.nbytes,
        "upload_s_median": median(figures.upload_s),
        "durable_through": job_log.watermark(),
        "recoveries": job_log.recoveries,
        "recovery_s": [round(x, 2) for x in job_log.recovery_s],
    }
    (out_dir / "report.json").write_text(
        json.dumps(
            {
                "before": asdict(report.before),
                "after": asdict(report.after),
                "gain_points": round(report.gain_points, 2),
                "wall_s": round(report.wall_s, 2),
                "iterations": len(report.iterations),
                "durability": durability,
                "weights": weights,
            },
            indent=1,
        )
    )


def median(values: list[float]) -> float:
    return round(statistics.median(values), 6) if values else 0.0

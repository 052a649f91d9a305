"""`rlsched run` on an embedded Ray cluster, as a user runs it: outputs, clean exits, nothing left running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray


def ray_processes() -> list[str]:
    """The raylets and GCS servers alive: of every Ray cluster on the machine, or, where RAY_TMPDIR
    is set (each pytest-xdist worker sets its own), of those whose session lives under it."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    ours = os.environ["RAY_TMPDIR"].rstrip("/") + "/" if os.environ.get("RAY_TMPDIR") else ""
    return [line for line in out.splitlines() if ("raylet" in line or "gcs_server" in line) and ours in line]


def rlsched_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlsched.cli", "run", "configs/jobs/quickstart.yaml", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=400,
    )


def settled_ray_processes(wait_s: float = 30.0) -> list[str]:
    """Ray processes still alive, after giving an earlier module's session up to `wait_s` to exit."""
    give_up = time.monotonic() + wait_s
    while (left := ray_processes()) and time.monotonic() < give_up:
        time.sleep(0.5)
    return left


def test_small_job_writes_its_outputs_and_leaves_nothing_running(tmp_path: Path) -> None:
    assert settled_ray_processes() == []  # a clean start, so that what is left afterwards is ours
    small = [
        "grpo.steps=3",
        "eval.every_steps=3",
        "task.eval_size=64",
        "eval.curve_size=32",
        "grpo.prompts_per_step=8",
        "tracking.prometheus_port=0",
    ]
    proc = rlsched_run("--out", str(tmp_path), *[a for s in small for a in ("--set", s)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "held-out pass rate before" in proc.stdout and "after" in proc.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert {
        "t_generate",
        "t_verify_exposed",
        "t_update",
        "t_publish",
        "t_iter",
        "overlap_fraction",
        "critical_path",
        "reward_mean",
        "pass_rate",
        "tokens_per_s",
    } <= set(rows[0])
    assert rows[2]["eval_pass_rate"] is not None
    trace = json.loads((tmp_path / "timeline.json").read_text())
    assert {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {
        "generate",
        "verify",
        "update",
        "load",
    }
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()
    assert "metrics: http://127.0.0.1:" in proc.stdout  # the driver's Prometheus endpoint, announced
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2, 3]
    assert [e.value for e in events.Scalars("loss")] == pytest.approx([r["loss"] for r in rows])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["weights"]["ranks_agree"] and report["weights"]["instances_at_latest"]
    assert report["durability"]["checkpoints"] == 1 and report["durability"]["durable_through"] == 3
    assert ray_processes() == []


def test_job_larger_than_the_cluster_is_refused() -> None:
    """The embedded cluster's size is the config's, so the refusal comes before Ray starts."""
    proc = rlsched_run("--set", "trainer.ranks=20")
    assert proc.returncode == 2
    assert "cannot host this job" in proc.stderr and "CPU: the job needs" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    assert ray_processes() == []


def test_unreachable_address_fails_fast() -> None:
    proc = rlsched_run("--address", "127.0.0.1:1")
    assert proc.returncode == 2 and "cannot reach the Ray cluster" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_custom_task_and_verifier_train_on_ray_and_ctrl_c_stops_cleanly_keeping_the_measured(
    tmp_path: Path,
) -> None:
    """Your own task (a JSONL file) and verifier (`module:callable`, configs/jobs/custom_task.yaml)
    train on Ray; Ctrl-C after two committed iterations exits with 130, no traceback, the committed
    iterations and the timeline kept, nothing left running. (One job for both: a job start is about
    50 s of CI.)"""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "rlsched.cli", "run", "configs/jobs/custom_task.yaml", "--out", str(tmp_path),
         "--set", "grpo.prompts_per_step=8", "--set", "grpo.time_budget_s=600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    # the held-out evaluation before training: the file's 100 problems (no line has a "split")
    assert re.search(r"held-out pass rate before: +[0-9.]+% \(\d+/100\)", out), out[-2000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(rows) >= 2 and [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(r["samples"] == 8 * 8 for r in rows)  # every sample judged by the module's verifier
    assert json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
    assert ray_processes() == []

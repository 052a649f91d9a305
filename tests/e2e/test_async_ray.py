"""`schedule.mode: async` on an embedded Ray cluster, with a deliberately slow trainer (four optimizer
steps per batch over small micro-batches): instances generate while the trainer updates, every step
is committed once, and no sample is trained past the staleness bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray
STEPS, K = 8, 1


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("async")
    settings = [
        "schedule.mode=async",
        f"rollout.max_staleness={K}",
        f"grpo.steps={STEPS}",
        "grpo.minibatches=4",
        "grpo.correction=decoupled",
        "trainer.micro_batch_tokens=256",
        "eval.every_steps=4",
        "task.eval_size=64",
        "eval.curve_size=32",
        "checkpoint.every=4",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rlsched.cli", "run", "configs/jobs/quickstart.yaml", "--out", str(out)]
        + [a for s in settings for a in ("--set", s)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def rows(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_every_step_is_committed_once_with_a_whole_batch(run: Path) -> None:
    got = rows(run)
    assert [r["iteration"] for r in got] == list(range(1, STEPS + 1))
    assert all(r["samples"] == 256 and r["used"] + r["faults"] == 256 for r in got)
    report = json.loads((run / "report.json").read_text())
    assert report["weights"]["ranks_agree"] and report["weights"]["instances_at_latest"]
    assert report["durability"]["durable_through"] == STEPS


def test_no_sample_is_trained_past_the_bound(run: Path) -> None:
    for r in rows(run):
        oldest_allowed = r["iteration"] - 1 - K  # step n trains from version n - 1
        assert min(r["extra"]["sample_versions"]) >= oldest_allowed, r["iteration"]
        assert max(int(k) for k in r["extra"]["staleness"]) <= K
        assert sum(r["extra"]["staleness"].values()) == r["samples"]
    assert any("1" in r["extra"]["staleness"] for r in rows(run))  # stale samples were trained


def test_the_trainer_updates_while_instances_generate_later_iterations(run: Path) -> None:
    trace = json.loads((run / "timeline.json").read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    updates = [e for e in spans if e["cat"] == "update"]
    batches = [e for e in spans if e["cat"] == "batch"]
    overlapped = [
        (u, b)
        for u in updates
        for b in batches
        if b["ts"] < u["ts"] + u["dur"] and u["ts"] < b["ts"] + b["dur"]
    ]
    assert overlapped, "no instance generated while the trainer updated"


def test_each_record_carries_the_importance_weights(run: Path) -> None:
    importance = rows(run)[-1]["extra"]["importance"]
    assert importance["correction"] == "decoupled" and importance["max"] >= importance["mean"] > 0

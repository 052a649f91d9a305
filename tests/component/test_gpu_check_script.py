"""`scripts/gpu_check.sh`, the checks a lent GPU machine runs, kept working here on the CPU: the
trainer's strategies agree, the torch engine finishes every request, a load confirms its checksum."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_runs_its_steps_on_the_cpu() -> None:
    out = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--device", "cpu", "--small", "--steps", "2", "--requests", "4",
         "--tokens", "8"],
        cwd=ROOT, env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    table = out.stdout.split("\n\n")[-1]
    trained = [line for line in table.splitlines() if line.startswith("train")]
    losses = {line.split("losses")[1].split("held")[0].strip() for line in trained}
    assert len(trained) == 2 and len(losses) == 1  # replicate and fsdp at one rank made the same steps
    assert "every request complete" in table and "checksum confirmed" in table

"""The layers and import contracts of `pyproject.toml` (`[tool.importlinter]`, docs/architecture.md
"Layers, checked") hold: run here so that CI checks them as `make lint` does."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_import_contract_is_kept() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert {c["id"] for c in contracts} >= {
        "layers",
        "cores-read-no-config",
        "plain-python",
        "job-without-ray",
        "acyclic",
    }
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in proc.stdout

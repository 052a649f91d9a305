"""Component fixtures: the tiny Llama (tests/tiny_models.py; `tiny_dirs` lives in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import Checkpoint, load_checkpoint


@pytest.fixture(scope="session", autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)  # 2 threads on 2 cores stall whenever another process runs (OpenMP waits)


@pytest.fixture(scope="session")
def tiny(tiny_dirs: dict[str, Path]) -> Checkpoint:
    """The tiny Llama, fp32, loaded once (tests must not change its weights)."""
    return load_checkpoint(tiny_dirs["llama"])


@pytest.fixture(scope="session")
def tiny_model(tiny: Checkpoint) -> Any:
    return tiny.model


@pytest.fixture()
def engine(tiny_dirs: dict[str, Path]) -> TorchRolloutEngine:
    ck = load_checkpoint(tiny_dirs["llama"])
    return TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=64, seed=3)

"""Component fixtures: the tiny Llama (tests/tiny_models.py; `tiny_dirs` lives in tests/conftest.py),
and a weight service holding a module's `blobs` (versions by number, each module's own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import Checkpoint, load_checkpoint
from rlsched.transfer.service import WeightService


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


@pytest.fixture
def service(blobs: dict[int, bytes]) -> Iterator[WeightService]:
    """A weight service (64 KiB chunks) that has published the requesting module's `blobs`."""
    svc = WeightService(chunk_bytes=64 << 10)
    for v, blob in blobs.items():
        svc.publish(v, blob)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    """The official `openai` client against the module's `server` fixture (a `serve.server.Running`)."""
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)

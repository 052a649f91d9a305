"""Bad input for the vLLM engine, checked without vLLM: a checkpoint it cannot serve is refused at
load with the reason, and a Python without vLLM says how to install it."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from rlsched.engine.vllm import SHARED_MEMORY, check_checkpoint, require_vllm, shared_file
from rlsched.errors import UserError
from rlsched.model.checkpoint import BASE_CHECKPOINT


def test_a_head_dimension_below_32_is_refused_at_load(tmp_path: Path) -> None:
    ckpt = tmp_path / "narrow"
    shutil.copytree(BASE_CHECKPOINT, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(head_dim=16, num_attention_heads=8)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="head dimension of 16; vLLM's CPU attention needs at least 32"):
        check_checkpoint(ckpt)
    assert check_checkpoint(BASE_CHECKPOINT).head_dim == 32  # the shipped model is served


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_error_says_how_to_install_it() -> None:
    with pytest.raises(UserError, match=r"pip install -e \.\[vllm\].*make setup-vllm"):
        require_vllm()


def test_weights_reach_the_workers_through_a_shared_memory_file_that_is_removed_after() -> None:
    blob = bytes(range(256)) * 1000
    with shared_file(blob) as path:
        assert path.read_bytes() == blob
        assert path.parent == SHARED_MEMORY or not SHARED_MEMORY.is_dir()
    assert not path.exists()
    with pytest.raises(RuntimeError), shared_file(blob) as failed:  # a failed load leaves nothing behind
        raise RuntimeError("the workers refused it")
    assert not failed.exists()

"""`trainer.precision: auto` and the engine's `dtype: auto` ask one question of the device, and BF16
forced where it is emulated says what it costs, once.

The other kind of CPU cannot be had in a test, so the no-BF16-units case replaces the one hardware
query (`bf16_native`) and leaves everything else real: the matmuls timed, the autocast entered."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from rlsched.config import Precision, load_config
from rlsched.engine.torch_engine import engine_dtype
from rlsched.model import precision
from rlsched.rl.update import TrainOptions, _autocast


def test_auto_is_the_default_and_every_shipped_training_config_uses_it(root: Path) -> None:
    assert load_config(root / "configs/jobs/quickstart.yaml").trainer.precision is Precision.AUTO
    for name in ("smollm2.yaml", "agent_calc.yaml"):
        assert load_config(root / "configs/jobs" / name).trainer.precision is Precision.AUTO, name


def test_auto_follows_the_engines_test_on_this_cpu() -> None:
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert precision.bf16_native("cpu") is native
    chosen = precision.train_precision(Precision.AUTO, "cpu")
    assert chosen is (Precision.BF16 if native else Precision.FP32)
    assert engine_dtype("auto") == (torch.bfloat16 if native else torch.float32)
    with _autocast(TrainOptions(precision=Precision.AUTO)):
        assert torch.is_autocast_enabled("cpu") is native
    with _autocast(TrainOptions(precision=Precision.FP32)):
        assert not torch.is_autocast_enabled("cpu")


def test_a_device_without_bf16_units_trains_fp32_under_auto_and_warns_once_when_bf16_is_forced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(precision, "bf16_native", lambda device_type="cpu": False)
    precision._warn_emulated.cache_clear()
    with caplog.at_level(logging.WARNING, logger="rlsched.model.precision"):
        assert precision.train_precision(Precision.AUTO, "cpu") is Precision.FP32
        assert not caplog.records  # auto chose fp32: nothing to warn about
        for _ in range(3):
            assert precision.train_precision(Precision.BF16, "cpu") is Precision.BF16
            with precision.autocast(Precision.BF16, "cpu"):
                assert torch.is_autocast_enabled("cpu")
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    message = caplog.records[0].getMessage()
    assert "no BF16 units" in message and "x an fp32" in message and "trainer.precision: auto" in message
    precision._warn_emulated.cache_clear()


def test_the_matmul_ratio_is_measured() -> None:
    ratio = precision.matmul_ratio("cpu", side=64, repeats=1)
    assert 0 < ratio < 1e4

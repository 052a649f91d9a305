"""Checkpoint directories: BF16 on disk, HF names, round trips, clear errors for broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rlsched.errors import UserError
from rlsched.model.checkpoint import BASE_CHECKPOINT, export_checkpoint, load_checkpoint, save_checkpoint
from rlsched.model.llama import LlamaForCausalLM
from rlsched.model.template import load_template
from rlsched.model.tokenizer import ByteTokenizer


def test_save_then_load_round_trips_bf16_values(tmp_path: Path, tiny_model: LlamaForCausalLM) -> None:
    out = save_checkpoint(tiny_model, ByteTokenizer(), load_template("chatml"), tmp_path / "ck")
    expected = {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    }
    assert expected <= {p.name for p in out.iterdir()}
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 (not a dict)
        assert f.metadata() == {"format": "pt"}
    loaded = load_checkpoint(out)
    for name, p in tiny_model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[name], p.to(torch.bfloat16).float())
    assert loaded.template.name == "chatml"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_shipped_base_exports(tmp_path: Path) -> None:
    out = export_checkpoint(tmp_path / "exported")
    assert (out / "model.safetensors").read_bytes() == (BASE_CHECKPOINT / "model.safetensors").read_bytes()
    with pytest.raises(UserError, match="not empty"):
        export_checkpoint(out)


def test_missing_checkpoint_file_is_a_user_error(tmp_path: Path) -> None:
    out = export_checkpoint(tmp_path / "ck")
    (out / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"missing model\.safetensors"):
        load_checkpoint(out)
    with pytest.raises(UserError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_corrupt_weights_are_a_user_error(tmp_path: Path) -> None:
    out = export_checkpoint(tmp_path / "ck")
    (out / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot be loaded"):
        load_checkpoint(out)

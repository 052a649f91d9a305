"""Checkpoint directories through transformers: every family, sharded and FP32 weights, BF16 bytes on
the wire with tied heads once, the directory a job writes, and a clear error for each bad one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rlsched.errors import UserError
from rlsched.model.checkpoint import (
    BASE_CHECKPOINT,
    export_checkpoint,
    inspect_checkpoint,
    load_checkpoint,
    load_state_bytes,
    to_bf16_bytes,
    write_checkpoint,
)


@pytest.mark.parametrize(
    ("family", "arch", "tied"),
    [
        ("llama", "LlamaForCausalLM", False),
        ("llama_tied", "LlamaForCausalLM", True),
        ("qwen2", "Qwen2ForCausalLM", False),
        ("qwen3", "Qwen3ForCausalLM", False),
        ("mistral", "MistralForCausalLM", False),
        ("sharded", "LlamaForCausalLM", False),
        ("fp32", "LlamaForCausalLM", False),
    ],
)
def test_every_family_loads(family: str, arch: str, tied: bool, tiny_dirs: dict[str, Path]) -> None:
    info = inspect_checkpoint(tiny_dirs[family])
    assert (info.architecture, info.tied, info.head_dim) == (arch, tied, 32)
    assert info.sharded == (family == "sharded")
    ck = load_checkpoint(tiny_dirs[family])
    assert next(ck.model.parameters()).dtype == torch.float32  # fp32 masters whatever is on disk
    assert ck.template.stop_token_ids  # EOS ids from generation_config.json (qwen2: two)
    if family == "qwen2":
        assert len(ck.template.stop_token_ids) == 2 and ck.tokenizer.pad_token_id is None


def test_bf16_bytes_round_trip_and_tied_heads_are_written_once(tiny_dirs: dict[str, Path]) -> None:
    untied = load_checkpoint(tiny_dirs["llama"]).model
    tied = load_checkpoint(tiny_dirs["llama_tied"]).model
    for model, has_head in ((untied, True), (tied, False)):
        blob = to_bf16_bytes(model)
        names = set(safe_open_bytes(blob))
        assert ("lm_head.weight" in names) == has_head
        copy = load_checkpoint(tiny_dirs["llama_tied" if not has_head else "llama"]).model
        with torch.no_grad():
            for p in copy.parameters():
                p.zero_()
        load_state_bytes(copy, blob)
        for name, p in model.state_dict().items():
            torch.testing.assert_close(copy.state_dict()[name], p.to(torch.bfloat16).float())


def safe_open_bytes(blob: bytes) -> list[str]:
    from safetensors.torch import load

    return list(load(blob))


def test_the_written_directory_loads_in_transformers_with_the_new_weights(
    tmp_path: Path, tiny_dirs: dict[str, Path]
) -> None:
    from transformers import AutoModelForCausalLM

    for family in ("llama_tied", "sharded"):
        model = load_checkpoint(tiny_dirs[family]).model
        with torch.no_grad():
            model.get_input_embeddings().weight.add_(0.5)
        out = write_checkpoint(tiny_dirs[family], to_bf16_bytes(model), tmp_path / family)
        assert not (out / "model.safetensors.index.json").exists()
        with safe_open(str(out / "model.safetensors"), framework="pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 (not a dict)
        again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        torch.testing.assert_close(
            again.get_input_embeddings().weight,
            model.get_input_embeddings().weight.to(torch.bfloat16).float(),
        )
        if family == "llama_tied":
            torch.testing.assert_close(
                again.get_output_embeddings().weight, again.get_input_embeddings().weight
            )


def test_an_mlc_template_is_remembered_beside_the_weights(tmp_path: Path) -> None:
    base = load_checkpoint()
    out = write_checkpoint(BASE_CHECKPOINT, to_bf16_bytes(base.model), tmp_path / "ck", "llama-2")
    assert load_checkpoint(out).template.name == "llama-2"
    assert load_checkpoint(BASE_CHECKPOINT).template.name == "checkpoint"


def test_shipped_base_exports(tmp_path: Path) -> None:
    out = export_checkpoint(tmp_path / "exported")
    assert (out / "model.safetensors").read_bytes() == (BASE_CHECKPOINT / "model.safetensors").read_bytes()
    with pytest.raises(UserError, match="not empty"):
        export_checkpoint(out)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(path: Path, **changes: object) -> None:
    data = json.loads((path / "config.json").read_text())
    data.update(changes)
    (path / "config.json").write_text(json.dumps(data))


def test_bad_checkpoints_are_user_errors_that_say_why(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=r"no config\.json, so it is not a Hugging Face checkpoint"):
        load_checkpoint(empty)
    alien = _copy(tiny_dirs["llama"], tmp_path / "alien")
    _edit_config(alien, architectures=["FancyNewForCausalLM"], model_type="fancy")
    with pytest.raises(UserError, match=r"'FancyNewForCausalLM'.*Tested: LlamaForCausalLM, Qwen2ForCausalLM"):
        inspect_checkpoint(alien)
    remote = _copy(tiny_dirs["llama"], tmp_path / "remote")
    _edit_config(remote, auto_map={"AutoModelForCausalLM": "modeling_x.X"})
    with pytest.raises(UserError, match="needs remote code"):
        inspect_checkpoint(remote)
    pickled = _copy(tiny_dirs["llama"], tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(UserError, match=r"only \.bin/\.pt \(pickle\) weights"):
        inspect_checkpoint(pickled)
    partial = _copy(tiny_dirs["sharded"], tmp_path / "partial")
    next(partial.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(UserError, match="missing shard"):
        inspect_checkpoint(partial)
    corrupt = _copy(tiny_dirs["llama"], tmp_path / "corrupt")
    (corrupt / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot be loaded by transformers"):
        load_checkpoint(corrupt)

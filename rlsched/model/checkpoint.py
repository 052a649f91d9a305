"""Checkpoint directories that rlsched, transformers and vLLM all load unchanged.

A directory holds `config.json` (HF LlamaConfig fields), `model.safetensors` (BF16, HF parameter
names), `tokenizer.json` (the `tokenizers` format), `tokenizer_config.json` (with the
`chat_template`), `chat_template.jinja` (where transformers 5 and vLLM look first) and
`generation_config.json`. Training keeps fp32 master weights; only the bytes on disk and on the wire
are BF16. The base model trained by `scripts/pretrain_base.py` ships in `rlsched/model/base/`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from rlsched.errors import UserError
from rlsched.model.llama import LlamaConfig, LlamaForCausalLM
from rlsched.model.template import ConvTemplate, load_template
from rlsched.model.tokenizer import EOS_ID, IM_END_ID, PAD_ID, SPECIAL_TOKENS, ByteTokenizer

BASE_CHECKPOINT = Path(__file__).resolve().parent / "base"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass
class Checkpoint:
    """A loaded checkpoint: fp32 model in eval mode, tokenizer, conversation template."""

    model: LlamaForCausalLM
    tokenizer: ByteTokenizer
    template: ConvTemplate
    path: Path


def to_bf16_bytes(model: torch.nn.Module) -> bytes:
    """The model's weights as BF16 safetensors bytes (what is written to disk and published)."""
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    return save(state, metadata={"format": "pt"})


def checksum(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def load_state_bytes(model: torch.nn.Module, blob: bytes) -> None:
    """Load BF16 safetensors bytes into a model, upcast to the model's dtype; names must match."""
    state = load(blob)
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(
            f"weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != model {tuple(own[name].shape)}")
            own[name].copy_(tensor.to(own[name].dtype))


def save_checkpoint(
    model: LlamaForCausalLM, tokenizer: ByteTokenizer, template: ConvTemplate, out: Path
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")
    (out / "model.safetensors").write_bytes(to_bf16_bytes(model))
    tokenizer.save(out / "tokenizer.json")
    jinja = template.to_jinja()
    (out / "chat_template.jinja").write_text(jinja)
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[1],
        "eos_token": SPECIAL_TOKENS[IM_END_ID],
        "unk_token": SPECIAL_TOKENS[0],
        "pad_token": SPECIAL_TOKENS[PAD_ID],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model.config.max_position_embeddings,
        "chat_template": jinja,
        "rlsched_conv_template": template.name,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    gen_cfg = {
        "bos_token_id": model.config.bos_token_id,
        "eos_token_id": sorted({EOS_ID, IM_END_ID, *template.stop_token_ids}),
        "pad_token_id": PAD_ID,
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
    }
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    return out


def load_checkpoint(path: Path | None = None) -> Checkpoint:
    """Load a checkpoint directory (default: the shipped base model) into an fp32 model."""
    path = Path(path) if path is not None else BASE_CHECKPOINT
    if not path.is_dir():
        raise UserError(
            f"checkpoint directory {path} does not exist; give a directory written by "
            "`rlsched model export DIR` (or leave it unset for the shipped base model)"
        )
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise UserError(
            f"checkpoint {path} is missing {', '.join(missing)}; re-export it with `rlsched model export DIR`"
        )
    try:
        cfg = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
        model = LlamaForCausalLM(cfg)
        load_state_bytes(model, (path / "model.safetensors").read_bytes())
        tokenizer = ByteTokenizer.from_file(path / "tokenizer.json")
    except (ValueError, TypeError, KeyError, SafetensorError, json.JSONDecodeError) as err:
        raise UserError(f"checkpoint {path} cannot be loaded: {err}") from None
    model.eval()
    tok_cfg_path = path / "tokenizer_config.json"
    name = "chatml"
    if tok_cfg_path.is_file():
        name = json.loads(tok_cfg_path.read_text()).get("rlsched_conv_template", name)
    return Checkpoint(model=model, tokenizer=tokenizer, template=load_template(name), path=path)


def export_checkpoint(out: Path, source: Path | None = None) -> Path:
    """Copy a checkpoint directory (default: the shipped base) to `out`, checking it loads first."""
    ckpt = load_checkpoint(source)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    for f in ckpt.path.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    return out

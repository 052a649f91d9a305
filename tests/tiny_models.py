"""Tiny random-weight Hugging Face checkpoints of each family the model path is tested on, built here.

No model hub is reachable, so the tests make their own: a byte-level BPE tokenizer trained with the
`tokenizers` library on a small corpus (with chat special tokens), a chat template per family, and
a model of each family with random weights (seeded), written with `save_pretrained` as BF16
safetensors. Head dim 32 (the smallest vLLM's CPU attention takes), 2 layers, GQA.

Families and what each one exercises:
- `llama`:      untied head, a Llama-3-style template that starts with BOS;
- `llama_tied`: the head tied to the embeddings (published once; the receiver re-ties it);
- `qwen2`:      QKV bias, ChatML, several EOS ids, no pad token;
- `qwen3`:      q/k norm, ChatML;
- `mistral`:    a sliding window shorter than the context, `[INST]` template.
Also `sharded` (Llama weights split over shards with an index) and `fp32` (weights on disk in FP32).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
SPECIALS = [
    "<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
]  # fmt: skip
CORPUS = [
    "What is 17+25? The answer is 42.",
    "Sam has 12 apples and buys 30 more. How many apples does Sam have now?",
    "Put the final answer in \\boxed{}. Think step by step.",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [INST] [/INST]",
    "Bonjour, ça va? Größe, naïve café — 東京 🙂",
    "user assistant system tool\n\n",
]
VOCAB = 384
FAMILIES = ("llama", "llama_tied", "qwen2", "qwen3", "mistral")


def tokenizer(template: str, eos: str, pad: str | None) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 8,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token=eos,
        unk_token="<unk>",
        pad_token=pad,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = template
    return hf


def _config(family: str, tok: Any) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    shape = {
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 256,
        "bos_token_id": tok.convert_tokens_to_ids("<s>"),
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    match family:
        case "llama" | "sharded" | "fp32":
            return LlamaConfig(**shape, tie_word_embeddings=False)
        case "llama_tied":
            return LlamaConfig(**shape, tie_word_embeddings=True)
        case "qwen2":
            return Qwen2Config(**shape, tie_word_embeddings=False, use_sliding_window=False)
        case "qwen3":
            return Qwen3Config(**shape, tie_word_embeddings=False)
        case "mistral":
            return MistralConfig(**shape, tie_word_embeddings=False, sliding_window=48)
    raise ValueError(family)


def _template(family: str) -> tuple[str, str, str | None, list[str]]:
    """(chat template, EOS token, pad token, every token that ends a turn)."""
    if family in ("llama", "sharded", "fp32"):
        return LLAMA3, "<|eot_id|>", "<pad>", ["<|eot_id|>", "</s>"]
    if family == "mistral":
        return MISTRAL, "</s>", "<pad>", ["</s>"]
    if family == "qwen2":  # no pad token; two EOS ids in generation_config.json
        return CHATML, "<|im_end|>", None, ["<|im_end|>", "</s>"]
    return CHATML, "<|im_end|>", "<pad>", ["<|im_end|>"]


def build(family: str, out: Path, seed: int = 0) -> Path:
    """Write a tiny checkpoint of `family` to `out` (BF16 unless `fp32`; sharded for `sharded`)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    template, eos, pad, ends = _template(family)
    tok = tokenizer(template, eos, pad)
    cfg = _config(family, tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # larger logits than a fresh init, so sampled sequences vary
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.08)
        model.get_output_embeddings().weight.mul_(4)
    dtype = torch.float32 if family == "fp32" else torch.bfloat16
    model = model.to(dtype)
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids(t) for t in ends],
        bos_token_id=cfg.bos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(
        out, safe_serialization=True, max_shard_size="200KB" if family == "sharded" else "5GB"
    )
    tok.save_pretrained(out)
    if family == "qwen2":  # a config without pad_token_id, as many Qwen checkpoints have
        cfg_path = out / "config.json"
        data = json.loads(cfg_path.read_text())
        data.pop("pad_token_id", None)
        cfg_path.write_text(json.dumps(data, indent=2))
    return out


def build_all(root: Path, families: tuple[str, ...] = FAMILIES) -> dict[str, Path]:
    return {f: build(f, root / f, seed=i) for i, f in enumerate(families)}

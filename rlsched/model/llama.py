"""A small Llama decoder in torch whose parameters and config match Hugging Face's LlamaForCausalLM.

RMSNorm, rotary embeddings (the `rotate_half` convention of HF, not the interleaved one), grouped
query attention and a SwiGLU MLP. Parameter names are HF's (`model.layers.0.self_attn.q_proj.weight`,
...), so a state dict saved from here is a checkpoint that transformers and vLLM load unchanged.

One forward serves training (no cache, right-padded rows) and decoding (a preallocated KV cache,
left-padded prompts, every row advancing one slot per step). Positions are passed in per row, so
the two paths see the same positions and give the same logits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 320
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32  # vLLM's CPU attention needs at least 32
    max_position_embeddings: int = 128
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 3

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim < 32 or self.head_dim % 2:
            raise ValueError(
                f"head_dim is {self.head_dim}; it must be even and at least 32 "
                "(vLLM's CPU attention needs 32)"
            )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` of the checkpoint directory (transformers 5 field names)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "initializer_range": 0.02,
            "use_cache": True,
            "dtype": "bfloat16",
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
        }

    @classmethod
    def from_hf(cls, data: dict[str, Any]) -> LlamaConfig:
        if data.get("model_type") != "llama":
            raise ValueError(f"model_type is {data.get('model_type')!r}, expected 'llama'")
        if data.get("tie_word_embeddings"):
            raise ValueError("tied word embeddings are not supported")
        fields = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        rope = data.get("rope_parameters") or {}
        if "rope_theta" in rope:
            fields["rope_theta"] = rope["rope_theta"]
        return cls(**fields)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [B, 1, T, head_dim] for integer positions [B, T]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class KVCache:
    """Preallocated keys and values for every layer, and which slots of each row hold real tokens."""

    def __init__(self, cfg: LlamaConfig, batch: int, slots: int, dtype: torch.dtype) -> None:
        shape = (batch, cfg.num_key_value_heads, slots, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.valid = torch.zeros(batch, slots, dtype=torch.bool)
        self.length = 0  # slots written so far (the same for every row)

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows so later steps spend no compute on them."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        self.valid = self.valid.index_select(0, rows)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        cache: KVCache | None,
        layer: int,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        cfg = self.cfg
        q = self.q_proj(x).view(b, t, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = cos_sin
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            start = cache.length
            cache.k[layer][:, :, start : start + t] = k
            cache.v[layer][:, :, start : start + t] = v
            k = cache.k[layer][:, :, : start + t]
            v = cache.v[layer][:, :, : start + t]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        cache: KVCache | None,
        index: int,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, mask, cache, index)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def init_weights(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        std = 0.02
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std, generator=gen)
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    p.mul_(1.0 / math.sqrt(2 * self.config.num_hidden_layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        key_valid: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Logits [B, T, V].

        Without a cache, `key_valid` [B, T] marks real tokens (default: all) and attention is causal.
        With a cache, the T new tokens go into slots `cache.length ..`; `cache.valid` must already
        mark them, and attention covers every valid slot up to each query's own.
        """
        b, t = input_ids.shape
        if positions is None:
            positions = torch.arange(t).expand(b, t)
        x = self.model.embed_tokens(input_ids)
        mask = _attention_mask(b, t, key_valid, cache)
        cos_sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos_sin, mask, cache, i)
        if cache is not None:
            cache.length += t
        return self.lm_head(self.model.norm(x))


def _attention_mask(b: int, t: int, key_valid: torch.Tensor | None, cache: KVCache | None) -> torch.Tensor:
    """Boolean [B, 1, T, S] mask: causal, real keys only; a query always sees itself (no NaN rows)."""
    start = cache.length if cache is not None else 0
    s = start + t
    q_idx = torch.arange(start, s)[:, None]
    k_idx = torch.arange(s)[None, :]
    causal = k_idx <= q_idx
    if cache is not None:
        valid = cache.valid[:, :s]
    elif key_valid is not None:
        valid = key_valid
    else:
        return causal[None, None]
    return ((causal[None] & valid[:, None, :]) | (k_idx == q_idx)[None])[:, None]

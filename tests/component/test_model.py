"""The decoder: the KV-cache path, the no-cache path and padding all give the same logits."""

from __future__ import annotations

import torch

from rlsched.model.llama import KVCache, LlamaConfig, LlamaForCausalLM


def test_kv_cache_matches_full_forward(tiny_model: LlamaForCausalLM) -> None:
    torch.manual_seed(0)
    ids = torch.randint(6, 262, (3, 20))
    with torch.no_grad():
        full = tiny_model(ids)
        cache = KVCache(tiny_model.config, 3, 20, torch.float32)
        cache.valid[:, :8] = True
        parts = [tiny_model(ids[:, :8], cache=cache)]
        for t in range(8, 20):
            cache.valid[:, t] = True
            parts.append(tiny_model(ids[:, t : t + 1], positions=torch.full((3, 1), t), cache=cache))
    stepped = torch.cat(parts, dim=1)
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-4)


def test_left_padding_does_not_change_logits(tiny_model: LlamaForCausalLM) -> None:
    seq = torch.randint(6, 262, (1, 12))
    padded = torch.cat([torch.full((1, 5), 3), seq], dim=1)
    valid = torch.cat([torch.zeros(1, 5, dtype=torch.bool), torch.ones(1, 12, dtype=torch.bool)], dim=1)
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        plain = tiny_model(seq)
        shifted = tiny_model(padded, positions=positions, key_valid=valid)[:, 5:]
    torch.testing.assert_close(shifted, plain, rtol=1e-4, atol=1e-4)


def test_parameter_names_follow_hugging_face() -> None:
    names = set(LlamaForCausalLM(LlamaConfig(num_hidden_layers=1)).state_dict())
    assert names == {
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        *(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
    }


def test_head_dim_below_32_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="head_dim"):
        LlamaConfig(head_dim=16)

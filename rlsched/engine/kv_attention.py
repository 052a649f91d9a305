"""A slot KV cache for any Hugging Face decoder, as a transformers attention implementation.

transformers lets a model's attention be swapped by name (`AttentionInterface.register`): the
model still computes its own projections, biases, q/k norms and rotary embeddings, then hands the
query, key and value of the new tokens to the registered function. This one writes the new keys and
values into a preallocated cache and attends over it, so the torch engine drives any checkpoint's
own `forward` with continuous batching, without transformers' cache objects:

- the cache holds `rows` sequences per layer, `[rows, kv_heads, slots, head_dim]`; the engine keeps
  its live requests in rows `0..B-1` (a finished row is refilled by moving the last one into it);
- a *prefill* forward runs newcomers' prompts, left-padded to one width, into chosen rows from
  slot 0; each row remembers `base` (its first real slot) and `end` (the next free slot);
- an *extend* forward runs the rest of newcomers' prompts after a prefix copied in from the prefix
  cache (`rlsched.engine.prefix_cache`): the new tokens end at the same slot in every row, each
  attends to its row's slots from `base`, and padding writes nothing;
- a *decode* forward takes one token per live row, writes it at that row's `end` and attends to
  slots `base..end` of the row (and a sliding window where the model has one).

The masks are built by the engine once per forward (`Step`) and read by every layer. No mask is
built by transformers: an implementation it does not know gets none (`masking_utils`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION = "rlsched_kv"


@dataclass
class SlotCache:
    k: list[torch.Tensor]  # per layer [rows, kv_heads, slots, head_dim]
    v: list[torch.Tensor]

    @classmethod
    def allocate(
        cls,
        layers: int,
        rows: int,
        kv_heads: int,
        slots: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> SlotCache:
        shape = (rows, kv_heads, slots, head_dim)
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
        )

    @property
    def rows(self) -> int:
        return self.k[0].shape[0]

    @property
    def slots(self) -> int:
        return self.k[0].shape[2]

    def take(self, other: SlotCache, rows: int, slots: int) -> None:
        """Copy `other`'s first `rows` rows' first `slots` slots in (a cache that grew)."""
        rows, slots = min(rows, other.rows), min(slots, other.slots)
        for mine, theirs in zip((*self.k, *self.v), (*other.k, *other.v), strict=True):
            mine[:rows, :, :slots] = theirs[:rows, :, :slots]

    def copy_row(self, src: int, dst: int, upto: int) -> None:
        """Row `dst` takes row `src`'s first `upto` slots (a finished row refilled, a prefix shared)."""
        for k, v in zip(self.k, self.v, strict=True):
            k[dst, :, :upto] = k[src, :, :upto]
            v[dst, :, :upto] = v[src, :, :upto]


@dataclass
class Step:
    """One forward's view of the cache: which rows, where new tokens go, what each query may see."""

    cache: SlotCache
    rows: torch.Tensor  # [B] cache rows of the batch's rows
    prefill: bool
    mask: torch.Tensor  # prefill [B, 1, T, T]; decode [B, 1, 1, S]
    window_mask: torch.Tensor | None = None  # the same within the model's sliding window, if it has one
    ends: torch.Tensor | None = None  # decode: [B] the slot each row's new token goes to
    read: int = 0  # decode: slots to read (max end + 1); extend: the width (new tokens end there)
    contiguous: bool = False  # rows are 0..B-1, so the cache is read as a view
    write: torch.Tensor | None = None  # extend: [B, 1, T, 1] which new tokens are real (not padding)

    def to(self, device: torch.device) -> Step:
        """The step with its index and mask tensors on the model's device (built on the CPU)."""
        if device.type == "cpu":
            return self
        return replace(
            self,
            rows=self.rows.to(device),
            mask=self.mask.to(device),
            window_mask=None if self.window_mask is None else self.window_mask.to(device),
            ends=None if self.ends is None else self.ends.to(device),
            write=None if self.write is None else self.write.to(device),
        )


def kv_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [B, H, T, D], key/value [B, KV, T, D] of the new tokens -> output [B, T, H, D]."""
    step: Step = kwargs["rlsched_step"]
    layer = module.layer_idx
    k_cache, v_cache = step.cache.k[layer], step.cache.v[layer]
    if step.prefill and step.write is not None:  # extend: after a cached prefix
        end = step.read
        begin = end - key.shape[2]
        old_k, old_v = k_cache[step.rows, :, begin:end], v_cache[step.rows, :, begin:end]
        k_cache[step.rows, :, begin:end] = torch.where(step.write, key, old_k)
        v_cache[step.rows, :, begin:end] = torch.where(step.write, value, old_v)
        keys, values = k_cache[step.rows, :, :end], v_cache[step.rows, :, :end]
    elif step.prefill:
        width = key.shape[2]
        k_cache[step.rows, :, :width] = key
        v_cache[step.rows, :, :width] = value
        keys, values = key, value
    else:
        assert step.ends is not None
        k_cache[step.rows, :, step.ends] = key[:, :, 0]
        v_cache[step.rows, :, step.ends] = value[:, :, 0]
        if step.contiguous:
            b = query.shape[0]
            keys, values = k_cache[:b, :, : step.read], v_cache[:b, :, : step.read]
        else:
            keys, values = k_cache[step.rows, :, : step.read], v_cache[step.rows, :, : step.read]
    # layers with a sliding window say so (Mistral, Qwen2 and others pass `sliding_window`)
    mask = step.window_mask if kwargs.get("sliding_window") and step.window_mask is not None else step.mask
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def prefill_mask(valid: torch.Tensor, window: int | None) -> torch.Tensor:
    """[B, 1, T, T]: causal over real (left-padded) tokens; a padding query sees itself (no NaN)."""
    t = valid.shape[1]
    idx = torch.arange(t)
    allowed = (idx[None, :] <= idx[:, None])[None] & valid[:, None, :]
    if window is not None:
        allowed &= (idx[:, None] - idx[None, :] < window)[None]
    allowed |= torch.eye(t, dtype=torch.bool)[None]
    return allowed[:, None]


def extend_mask(bases: torch.Tensor, valid: torch.Tensor, width: int, window: int | None) -> torch.Tensor:
    """[B, 1, T, width]: the new tokens fill each row's last T slots (left-padded where a row has
    fewer); each real one sees its row's slots from `base` up to its own, and a padding query only
    its own slot (no NaN)."""
    t = valid.shape[1]
    q_slot = torch.arange(width - t, width)[None, :, None]  # [1, T, 1]
    k_slot = torch.arange(width)[None, None, :]  # [1, 1, W]
    allowed = (k_slot >= bases[:, None, None]) & (k_slot <= q_slot) & valid[:, :, None]
    if window is not None:
        allowed &= k_slot > q_slot - window
    allowed |= (k_slot == q_slot) & ~valid[:, :, None]
    return allowed[:, None]


def decode_mask(bases: torch.Tensor, ends: torch.Tensor, read: int, window: int | None) -> torch.Tensor:
    """[B, 1, 1, S]: each row sees its slots base..end (its new token included)."""
    idx = torch.arange(read)[None, :]
    allowed = (idx >= bases[:, None]) & (idx <= ends[:, None])
    if window is not None:
        allowed &= idx > ends[:, None] - window
    return allowed[:, None, None, :]


def register() -> None:
    """Make `ATTENTION` a name transformers resolves (idempotent; every process that loads an engine)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, kv_attention)


def sliding_window(config: Any) -> int | None:
    """The model's attention window, if any layer uses one (each such layer says so when called)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)

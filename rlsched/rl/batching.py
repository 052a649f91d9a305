"""Pack prompt + completion token sequences into right-padded training tensors.

Rows start at position 0 and are padded on the right, so attention needs only the causal mask.
`targets[i, t]` is the token that position t predicts (the next one) and `loss_mask` marks the
completion tokens, the only ones a loss is taken on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # [B, T]
    targets: torch.Tensor  # [B, T], next token at each position
    loss_mask: torch.Tensor  # [B, T] float, 1 where targets is a completion token
    completion_slices: tuple[slice, ...]  # per row: positions whose targets are the completion

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


def pack(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int) -> PackedBatch:
    if len(prompts) != len(completions):
        raise ValueError("one completion per prompt")
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(lengths)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    targets = torch.full_like(ids, pad_id)
    mask = torch.zeros(len(prompts), width)
    slices = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        seq = torch.tensor([*p, *c], dtype=torch.long)
        ids[i, : len(seq)] = seq
        targets[i, : len(seq) - 1] = seq[1:]
        s = slice(len(p) - 1, len(seq) - 1)
        mask[i, s] = 1.0
        slices.append(s)
    return PackedBatch(ids, targets, mask, tuple(slices))


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) at every position, [B, T], in float32."""
    return logits.float().log_softmax(-1).gather(-1, targets[..., None])[..., 0]

"""Pack prompt + completion token sequences into right-padded training tensors, in micro-batches.

Rows start at position 0 and are padded on the right, so attention needs only the causal mask and
the padding mask. `targets[i, t]` is the token that position t predicts (the next one) and
`loss_mask` marks the completion tokens, the only ones a loss is taken on.

`micro_batches` splits a batch by a token budget: sequences sorted by length fill micro-batches
whose padded size (rows x width) stays within `max_tokens`, so a pretrained model's 49,152-way
logits never have to exist for the whole batch at once and little compute goes to padding.
`sequence_logprobs` runs a Hugging Face causal LM on a packed batch and returns log p(target) at
each position, computing the LM head only from the first completion position on
(`logits_to_keep`), since prompt positions carry no loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    targets: torch.Tensor  # [B, T], next token at each position
    loss_mask: torch.Tensor  # [B, T] float, 1 where targets is a completion token
    completion_slices: tuple[slice, ...]  # per row: positions whose targets are the completion

    def to(self, device: torch.device) -> PackedBatch:
        if device.type == "cpu":
            return self
        return PackedBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.targets.to(device),
            self.loss_mask.to(device),
            self.completion_slices,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def first_completion(self) -> int:
        """The earliest position any row takes a loss at."""
        return min(s.start for s in self.completion_slices)


def pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    masks: Sequence[Sequence[float] | None] | None = None,
) -> PackedBatch:
    """`masks`: per completion, 1 where its token takes the loss (None: all of them)."""
    if len(prompts) != len(completions):
        raise ValueError("one completion per prompt")
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(lengths)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    targets = torch.full_like(ids, pad_id)
    mask = torch.zeros(len(prompts), width)
    slices = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        seq = torch.tensor([*p, *c], dtype=torch.long)
        ids[i, : len(seq)] = seq
        attention[i, : len(seq)] = 1
        targets[i, : len(seq) - 1] = seq[1:]
        s = slice(len(p) - 1, len(seq) - 1)
        own = masks[i] if masks is not None else None
        mask[i, s] = 1.0 if own is None else torch.tensor(own, dtype=mask.dtype)
        slices.append(s)
    return PackedBatch(ids, attention, targets, mask, tuple(slices))


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped so that each group's rows x longest row stays within `max_tokens` (a row longer
    than the budget goes alone); longest first, so the first micro-batch shows the peak memory."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) at every position, [B, T], in float32 (without a full log-softmax tensor)."""
    logits = logits.float()
    return logits.gather(-1, targets[..., None])[..., 0] - logits.logsumexp(-1)


def sequence_logprobs(model: Any, batch: PackedBatch) -> torch.Tensor:
    """[B, T] log-probs of `batch.targets` under `model`; zero before the first completion position."""
    start = batch.first_completion
    width = batch.input_ids.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        use_cache=False,
        logits_to_keep=width - start,
    )
    logp = token_logprobs(out.logits, batch.targets[:, start:])
    return torch.nn.functional.pad(logp, (start, 0))

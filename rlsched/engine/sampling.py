"""Batched next-token selection: temperature, top-k, top-p, greedy, per-request seeds.

Every row of a batch may carry its own knobs. A row with a seed draws its noise from its own
generator, so its tokens do not depend on which other requests share the batch (vLLM's per-request
seed semantics). Sampling uses the exponential race (argmax of p / E, E ~ Exp(1)), which equals a
multinomial draw and lets all rows be sampled with one argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlsched.engine.protocol import SamplingParams


@dataclass
class RowSamplers:
    """Per-row sampling state for one batch."""

    temperature: torch.Tensor  # [B], 0 for greedy rows
    top_k: torch.Tensor  # [B], 0 for off
    top_p: torch.Tensor  # [B]
    generators: list[torch.Generator | None]
    any_filter: bool

    @classmethod
    def build(cls, params: Sequence[SamplingParams], shared: torch.Generator) -> RowSamplers:
        gens: list[torch.Generator | None] = [
            torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in params
        ]
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
            generators=[g if g is not None else shared for g in gens],
            any_filter=any(p.top_k > 0 or p.top_p < 1 for p in params),
        )

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.temperature = self.temperature.index_select(0, rows)
        self.top_k = self.top_k.index_select(0, rows)
        self.top_p = self.top_p.index_select(0, rows)
        keep = rows.tolist()
        self.generators = [self.generators[i] for i in keep]


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    drop = ranks >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    before = probs.cumsum(-1) - probs  # mass strictly before each token
    drop |= before >= top_p[:, None]
    drop[:, 0] = False  # always keep the most likely token
    filtered = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, filtered)


def _exponential_noise(shape: tuple[int, int], generators: list[torch.Generator]) -> torch.Tensor:
    noise = torch.empty(shape)
    shared = generators[0] if generators and all(g is generators[0] for g in generators) else None
    if shared is not None:
        return noise.exponential_(generator=shared)
    for i, g in enumerate(generators):
        noise[i].exponential_(generator=g)
    return noise


def select_tokens(logits: torch.Tensor, rows: RowSamplers) -> torch.Tensor:
    """Next token per row from last-position logits [B, V] (float32)."""
    greedy = logits.argmax(-1)
    if bool((rows.temperature == 0).all()):
        return greedy
    temp = torch.where(rows.temperature > 0, rows.temperature, 1.0)[:, None]
    scaled = logits / temp
    if rows.any_filter:
        scaled = _filter_top_k_top_p(scaled, rows.top_k, rows.top_p)
    probs = scaled.softmax(-1)
    noise = _exponential_noise(tuple(probs.shape), rows.generators)  # type: ignore[arg-type]
    sampled = (probs / noise).argmax(-1)
    return torch.where(rows.temperature == 0, greedy, sampled)

"""Supervised next-token training on answer tokens: how the base model is made, and the peer GRPO is
compared with (`scripts/bench_rl_vs_sft.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlsched.model.template import PromptFormat
from rlsched.model.tokenizer import Tokenizer
from rlsched.rl.batching import pack, sequence_logprobs
from rlsched.rl.task import Problem


def turn_end_id(tokenizer: Tokenizer, template: PromptFormat) -> int:
    """The token that ends an assistant turn: the template's first stop string where it is one token
    (ChatML's <|im_end|>), else the tokenizer's EOS."""
    for stop in template.stop_str:
        if (i := tokenizer.id_of(stop)) is not None:
            return i
    if tokenizer.eos_token_id is not None:
        return tokenizer.eos_token_id
    return template.stop_token_ids[0]


def sft_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    tokenizer: Tokenizer,
    template: PromptFormat,
    problems: Sequence[Problem],
    answers: Sequence[str],
    max_grad_norm: float = 1.0,
) -> float:
    """One step of cross-entropy on `answers`, each followed by the template's first stop token (the
    end of the assistant turn); returns the loss."""
    end = turn_end_id(tokenizer, template)
    prompts = tokenizer.encode_batch([p.prompt(template) for p in problems])
    targets = [[*tokenizer.encode(a), end] for a in answers]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = pack(prompts, targets, pad)
    model.train()
    logp = sequence_logprobs(model, batch)
    loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return float(loss.detach())

"""Supervised next-token training on answer tokens: how the base model is made, and the peer GRPO is
compared with (`scripts/bench_rl_vs_sft.py`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlsched.model.llama import LlamaForCausalLM
from rlsched.model.template import ConvTemplate
from rlsched.model.tokenizer import IM_END_ID, PAD_ID, ByteTokenizer
from rlsched.rl.batching import pack, token_logprobs
from rlsched.rl.task import Problem


def sft_step(
    model: LlamaForCausalLM,
    optimizer: torch.optim.Optimizer,
    tokenizer: ByteTokenizer,
    template: ConvTemplate,
    problems: Sequence[Problem],
    answers: Sequence[str],
    max_grad_norm: float = 1.0,
) -> float:
    """One step of cross-entropy on `answers` (each followed by the end-of-turn token); returns the loss."""
    prompts = tokenizer.encode_batch([p.prompt(template) for p in problems])
    targets = [[*tokenizer.encode(a), IM_END_ID] for a in answers]
    batch = pack(prompts, targets, PAD_ID)
    model.train()
    logp = token_logprobs(model(batch.input_ids), batch.targets)
    loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return float(loss.detach())

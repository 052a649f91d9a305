"""One GRPO update of a policy from judged samples: what a single process and each Ray rank run.

A `TrainItem` is all an update needs of a sample: its prompt and completion ids, the log-probs the
engine reported when it sampled them, and its advantage. Data-parallel ranks each take a shard,
divide by the whole batch's token count, and sum their gradients through `reduce_grads` (an
all-reduce), so every rank applies the same step and their weights stay identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlsched.config import GRPOConfig
from rlsched.model.llama import LlamaForCausalLM
from rlsched.rl.batching import pack, token_logprobs
from rlsched.rl.grpo import LossStats, grpo_loss


@dataclass(frozen=True)
class TrainItem:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantage: float


def grpo_update(
    policy: LlamaForCausalLM,
    optimizer: torch.optim.Optimizer,
    items: Sequence[TrainItem],
    cfg: GRPOConfig,
    *,
    reference: LlamaForCausalLM | None = None,
    token_count: float | None = None,
    reduce_grads: Callable[[LlamaForCausalLM], None] | None = None,
) -> LossStats:
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    stats = LossStats(0.0, 0.0, 0.0, 1.0)
    if items:
        batch = pack([i.prompt_ids for i in items], [i.token_ids for i in items], policy.config.pad_token_id)
        old = torch.zeros_like(batch.loss_mask)
        for row, (item, sl) in enumerate(zip(items, batch.completion_slices, strict=True)):
            old[row, sl] = torch.tensor(item.logprobs)
        ref = None
        if reference is not None and cfg.kl_coef > 0:
            with torch.no_grad():
                ref = token_logprobs(reference(batch.input_ids), batch.targets)
        new = token_logprobs(policy(batch.input_ids), batch.targets)
        advantages = torch.tensor([i.advantage for i in items])
        loss, stats = grpo_loss(
            new,
            old,
            advantages,
            batch.loss_mask,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            ref_logp=ref,
            kl_coef=cfg.kl_coef,
            token_count=token_count,
        )
        loss.backward()
    else:  # a rank with an empty shard still takes part in the all-reduce
        for p in policy.parameters():
            p.grad = torch.zeros_like(p)
    if reduce_grads is not None:
        reduce_grads(policy)
    torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
    optimizer.step()
    return stats

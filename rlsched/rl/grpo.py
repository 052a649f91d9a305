"""GRPO: group-relative advantages and a token-level clipped policy-gradient loss.

Each prompt is sampled `group_size` times; a sample's advantage is its reward minus the group's mean,
divided by the group's standard deviation (groups where every reward is equal carry no signal and get
advantage 0). The loss is PPO's clipped surrogate averaged over all completion tokens of the batch
(token-level, as DAPO recommends, so long answers are not down-weighted), with asymmetric clipping
(`clip_low`, `clip_high`) and an optional KL penalty to a frozen reference using the k3 estimator.
The ratio's denominator is the log-probability the rollout engine reported when it sampled the token,
so the published BF16 weights, not the fp32 masters, are the behaviour policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Rewards [groups, group_size] -> advantages of the same shape."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError("rewards must be [groups, group_size] with group_size >= 2")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)


@dataclass(frozen=True)
class LossStats:
    loss: float
    clip_fraction: float
    kl: float
    mean_ratio: float


def grpo_loss(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_count: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """All tensors [B, T] except `advantages` [B]; `mask` marks completion tokens.

    `token_count` is the number of completion tokens the mean is taken over; by default this batch's.
    Data-parallel ranks pass the whole batch's count so that their summed gradients are the gradient
    of one token-level mean.
    """
    adv = advantages[:, None]
    ratio = torch.exp(new_logp - old_logp)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    tokens = mask.sum().clamp(min=1.0) if token_count is None else torch.tensor(max(token_count, 1.0))
    loss = -(surrogate * mask).sum() / tokens
    kl = torch.zeros(())
    if ref_logp is not None and kl_coef > 0:
        log_r = ref_logp - new_logp
        kl = ((torch.exp(log_r) - log_r - 1.0) * mask).sum() / tokens
        loss = loss + kl_coef * kl
    with torch.no_grad():
        was_clipped = ((ratio * adv) > (clipped * adv)).float()
        stats = LossStats(
            loss=float(loss),
            clip_fraction=float((was_clipped * mask).sum() / tokens),
            kl=float(kl),
            mean_ratio=float((ratio * mask).sum() / tokens),
        )
    return loss, stats

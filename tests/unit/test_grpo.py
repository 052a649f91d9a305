"""GRPO's pieces: group-relative advantages and the clipped token-level loss."""

from __future__ import annotations

import pytest
import torch

from rlsched.rl.grpo import group_advantages, grpo_loss


def test_advantages_are_relative_within_each_group() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    adv = group_advantages(rewards)
    assert adv[0].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-4)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # no signal in a uniform group
    assert adv[2, 3] > 0 > adv[2, 0]
    assert adv.sum(dim=1).tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-5)


def test_advantages_need_groups() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0]]))


def test_loss_gradient_raises_logprob_of_good_samples() -> None:
    new = torch.zeros(2, 3, requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = grpo_loss(new, old, torch.tensor([1.0, -1.0]), mask)
    loss.backward()
    assert new.grad is not None
    assert (new.grad[0, :2] < 0).all() and (new.grad[1] > 0).all()  # descent raises row 0, lowers row 1
    assert new.grad[0, 2] == 0  # padding carries no gradient
    assert stats.mean_ratio == pytest.approx(1.0) and stats.clip_fraction == 0.0


def test_clipping_stops_the_push_beyond_the_trust_region() -> None:
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)  # ratios 1.5 and 1.1
    loss, stats = grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert new.grad is not None
    assert new.grad[0, 0] == 0 and new.grad[0, 1] != 0
    assert stats.clip_fraction == pytest.approx(0.5)


def test_token_level_mean_weights_every_token_equally() -> None:
    new = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    loss, _ = grpo_loss(new, torch.zeros(2, 4), torch.tensor([1.0, 1.0]), mask)
    loss.backward()
    assert new.grad is not None
    assert new.grad[0, 0] == new.grad[1, 3]


def test_kl_term_is_zero_at_the_reference_and_positive_away() -> None:
    new = torch.zeros(1, 3)
    _, at_ref = grpo_loss(new, new, torch.tensor([0.0]), torch.ones(1, 3), ref_logp=new, kl_coef=0.1)
    _, away = grpo_loss(new, new, torch.tensor([0.0]), torch.ones(1, 3), ref_logp=new - 0.5, kl_coef=0.1)
    assert at_ref.kl == pytest.approx(0.0) and away.kl > 0

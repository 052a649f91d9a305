"""GRPO's pieces: group-relative advantages and the clipped token-level loss."""

from __future__ import annotations

import pytest
import torch

from rlsched.config import Correction
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


# -- off-policy corrections --------------------------------------------------------------------------

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])
BEHAVIOUR = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, 0.0]])  # the version that sampled them


def _loss(correction: Correction, new: torch.Tensor, prox: torch.Tensor | None, cap: float = 2.0):  # type: ignore[no-untyped-def]
    new = new.clone().requires_grad_(True)
    loss, stats = grpo_loss(new, BEHAVIOUR, ADV, MASK, correction=correction, prox_logp=prox, cap=cap)
    loss.backward()
    assert new.grad is not None
    return loss, stats, new.grad


def test_behaviour_is_the_clipped_ratio_against_the_engines_log_probs_as_before() -> None:
    new = BEHAVIOUR + 0.05
    loss, stats, _ = _loss(Correction.BEHAVIOUR, new, None)
    plain, plain_stats = grpo_loss(new, BEHAVIOUR, ADV, MASK)
    assert float(loss.detach()) == pytest.approx(float(plain.detach())) and stats == plain_stats
    assert stats.is_mean == pytest.approx(float(torch.exp(torch.tensor(0.05))), rel=1e-5)


def test_none_anchors_on_the_proximal_policy_and_ignores_how_stale_the_tokens_are() -> None:
    new = BEHAVIOUR + 1.0  # the policy moved far since these were sampled
    _, stats, grad = _loss(Correction.NONE, new, new.detach())
    _, _, near = _loss(Correction.NONE, BEHAVIOUR + 0.1, BEHAVIOUR + 0.1)  # a fresher sample
    assert stats.mean_ratio == pytest.approx(1.0) and stats.clip_fraction == 0.0
    assert torch.equal(grad, near)
    assert grad[0, 0] == pytest.approx(-1.0 / 5)  # -adv / tokens: weight 1 whatever the staleness
    assert stats.is_mean == pytest.approx(float(torch.exp(torch.tensor(1.0))), rel=1e-5)  # seen, not used


def test_decoupled_weights_the_proximal_clip_by_the_capped_behaviour_weight() -> None:
    prox = BEHAVIOUR + torch.tensor([[0.2, 2.0, 0.0], [0.0, 0.0, 0.0]])  # token (0,1) weight e^2 > cap
    _, stats, grad = _loss(Correction.DECOUPLED, prox, prox, cap=2.0)
    assert grad[0, 0] == pytest.approx(-float(torch.exp(torch.tensor(0.2))) / 5, rel=1e-5)
    assert grad[0, 1] == pytest.approx(-2.0 / 5, rel=1e-5)  # capped
    assert stats.is_capped == pytest.approx(1 / 5) and stats.is_max == pytest.approx(
        float(torch.exp(torch.tensor(2.0)))
    )


def test_truncated_is_has_no_trust_region_only_the_capped_weight() -> None:
    new = BEHAVIOUR + torch.tensor([[2.0, 0.0, 0.0], [0.0, -0.5, 0.0]])  # ratio e^2: PPO would clip it
    _, ppo_stats, ppo_grad = _loss(Correction.BEHAVIOUR, new, None)
    _, _, grad = _loss(Correction.TRUNCATED_IS, new, None, cap=3.0)
    assert ppo_grad[0, 0] == 0.0 and ppo_stats.clip_fraction > 0  # clipped away
    assert grad[0, 0] == pytest.approx(-3.0 / 5, rel=1e-5)  # weight min(e^2, 3) = 3
    assert grad[1, 1] == pytest.approx(float(torch.exp(torch.tensor(-0.5))) / 5, rel=1e-5)
    assert grad[1, 2] == 0.0  # masked


def test_a_proximal_correction_without_the_proximal_log_probs_is_refused() -> None:
    with pytest.raises(ValueError, match="needs the proximal policy's log-probs"):
        grpo_loss(BEHAVIOUR, BEHAVIOUR, ADV, MASK, correction=Correction.DECOUPLED)

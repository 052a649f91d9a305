"""A batch's update on the toy model: the proximal policy's log-probs taken before any step, one
optimizer step per minibatch with its own learning rate, and the corrections' figures."""

from __future__ import annotations

import pytest
import torch

from rlsched.config import Correction, GRPOConfig
from rlsched.model.checkpoint import load_checkpoint
from rlsched.rl.grpo import LossStats
from rlsched.rl.update import TrainItem, TrainOptions, grpo_update, minibatches, update_batch, with_proximal

OPTS = TrainOptions(pad_id=3)


def items(n: int = 6) -> list[TrainItem]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        prompt = torch.randint(4, 200, (5,), generator=gen).tolist()
        tokens = torch.randint(4, 200, (4 + i % 3,), generator=gen).tolist()
        out.append(
            TrainItem(tuple(prompt), tuple(tokens), tuple([-5.5] * len(tokens)), 1.0 if i % 2 else -1.0)
        )
    return out


def run(correction: Correction, parts: int, **kw: float) -> tuple[LossStats, torch.optim.Optimizer]:
    torch.manual_seed(0)
    policy = load_checkpoint(None).model
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    cfg = GRPOConfig(correction=correction, minibatches=parts, warmup_steps=4, lr=1e-2, **kw)  # type: ignore[arg-type]
    stats = update_batch(policy, optimizer, minibatches(items(), parts), cfg, steps_done=1, options=OPTS)
    return stats, optimizer


def test_each_minibatch_is_one_optimizer_step_with_the_learning_rate_of_its_step() -> None:
    _, optimizer = run(Correction.BEHAVIOUR, 3)
    state = next(iter(optimizer.state.values()))
    assert int(state["step"]) == 3
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)  # steps 2, 3, 4 of a 4-step warm-up


def test_the_proximal_log_probs_are_the_policys_own_before_any_step() -> None:
    torch.manual_seed(0)
    policy = load_checkpoint(None).model
    batch = items()
    with_prox = with_proximal(policy, batch, OPTS)
    assert [len(i.prox_logprobs) for i in with_prox] == [len(i.token_ids) for i in batch]
    assert all(max(i.prox_logprobs) < 0 for i in with_prox)
    stats = grpo_update(
        policy,
        torch.optim.AdamW(policy.parameters()),
        with_prox,
        GRPOConfig(correction=Correction.NONE),
        options=OPTS,
    )
    assert stats.mean_ratio == pytest.approx(1.0, abs=1e-5) and stats.clip_fraction == 0.0


def test_decoupled_binds_only_after_the_first_step_of_a_batch() -> None:
    one, _ = run(Correction.DECOUPLED, 1)
    two, _ = run(Correction.DECOUPLED, 2)
    assert one.mean_ratio == pytest.approx(1.0, abs=1e-5)  # pi = pi_proximal on the only step
    assert abs(two.mean_ratio - 1.0) > 1e-4  # the second step's ratio moved off 1
    assert one.is_max > 2.0 and one.is_capped > 0  # some behaviour log-probs of -5.5 lie far below


def test_a_proximal_correction_outside_a_batch_update_is_refused() -> None:
    policy = load_checkpoint(None).model
    cfg = GRPOConfig(correction=Correction.DECOUPLED)
    with pytest.raises(ValueError, match="needs the proximal log-probs: run update_batch"):
        grpo_update(policy, torch.optim.AdamW(policy.parameters()), items(), cfg, options=OPTS)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"minibatches": 300}, "minibatches .300. is more than the 256 samples"),
        ({"importance_cap": 1.0}, "greater than 1"),
    ],
)
def test_settings_that_cannot_work_are_refused(kw: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**kw)  # type: ignore[arg-type]

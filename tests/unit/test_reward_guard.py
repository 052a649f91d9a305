"""Rewards are data with a range (issue 41, finding 3): a verifier's reward that is not a finite number
in the task's range is a fault, never a reward; a step whose loss or gradient is not finite is skipped
and counted, the weights and the optimizer's state untouched; a client's reference reaches only a
verifier that treats it as data."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rlsched.config import GRPOConfig
from rlsched.config_task import TaskConfig
from rlsched.model.checkpoint import load_checkpoint
from rlsched.rl.update import TrainItem, TrainOptions, grpo_update, skipped_note, update_batch
from verifiers.loading import load_verifier
from verifiers.protocol import (
    ExecutionFault,
    FaultKind,
    RewardRange,
    Verdict,
    VerifyRequest,
    client_reference_refusal,
    run_verifier,
)

OPTS = TrainOptions(pad_id=3)


class Constant:
    """A researcher's verifier that returns whatever it was built with."""

    def __init__(self, reward: float) -> None:
        self.name, self.reward = "constant", reward

    def verify(self, request: VerifyRequest) -> Verdict:
        return Verdict(request.sample_id, self.reward, self.reward >= 1.0)


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf, 1e308, -0.5, 1.0000001], ids=str)
def test_a_verifier_reward_outside_the_range_is_a_fault_not_a_reward(reward: float) -> None:
    outcome = run_verifier(Constant(reward), VerifyRequest("s", "x", "1"))
    assert isinstance(outcome, ExecutionFault) and outcome.kind is FaultKind.CRASH
    assert "task.reward_range" in outcome.detail or "not a finite number" in outcome.detail


def test_a_task_that_declares_its_range_gets_it() -> None:
    wide = TaskConfig(reward_range=(-1.0, 2.0)).rewards()
    assert isinstance(run_verifier(Constant(-0.5), VerifyRequest("s", "x", "1"), wide), Verdict)
    assert isinstance(run_verifier(Constant(1.0), VerifyRequest("s", "x", "1")), Verdict)
    for bad in ((1.0, 0.0), (0.0, math.inf), (math.nan, 1.0)):
        with pytest.raises(ValidationError, match="two finite numbers, low below high"):
            TaskConfig(reward_range=bad)


def test_a_number_returned_by_a_plain_function_is_held_to_the_range() -> None:
    fault = run_verifier(
        load_verifier("tests.unit.test_reward_guard:nan_reward"), VerifyRequest("s", "x", "1")
    )
    assert isinstance(fault, ExecutionFault) and "not a finite number" in fault.detail


def nan_reward(request: VerifyRequest) -> float:
    return math.nan


def items(advantage: float) -> list[TrainItem]:
    return [
        TrainItem((5, 6, 7), (8, 9, 10, 11), (-5.0,) * 4, advantage),
        TrainItem((5, 6), (12, 13), (-5.0,) * 2, -1.0),
    ]


def snapshot(policy: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], int]:
    steps = [int(s["step"]) for s in optimizer.state.values()]
    return [p.detach().clone() for p in policy.parameters()], sum(steps)


@pytest.mark.parametrize("advantage", [math.nan, math.inf])
def test_a_non_finite_loss_skips_the_step_and_leaves_the_weights(advantage: float) -> None:
    torch.manual_seed(0)
    policy = load_checkpoint(None).model
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    grpo_update(policy, optimizer, items(1.0), GRPOConfig(), options=OPTS)  # one real step: Adam has state
    weights, steps = snapshot(policy, optimizer)
    stats = grpo_update(policy, optimizer, items(advantage), GRPOConfig(), options=OPTS)
    assert stats.skipped == 1
    after, steps_after = snapshot(policy, optimizer)
    assert steps_after == steps and all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    assert all(p.grad is None for p in policy.parameters())  # nothing left to leak into the next step
    again = grpo_update(policy, optimizer, items(1.0), GRPOConfig(), options=OPTS)
    assert again.skipped == 0 and not all(
        torch.equal(a, b) for a, b in zip(weights, policy.parameters(), strict=True)
    )


def test_skipped_steps_are_counted_over_a_batch_and_named() -> None:
    torch.manual_seed(0)
    policy = load_checkpoint(None).model
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    parts = [items(math.nan), items(1.0), items(math.nan)]
    stats = update_batch(policy, optimizer, parts, GRPOConfig(minibatches=3), steps_done=0, options=OPTS)
    assert stats.skipped == 2
    note = skipped_note(stats, 7)
    assert note is not None and note.startswith("iteration 7: 2 update step(s) skipped")
    assert (
        skipped_note(
            update_batch(policy, optimizer, [items(1.0)], GRPOConfig(), steps_done=3, options=OPTS), 8
        )
        is None
    )


@pytest.mark.parametrize(
    ("kind", "taken"),
    [
        ("exact_answer", True),
        ("math", True),
        ("math_strict", True),
        ("code", False),
        ("cuda", False),
        ("synthetic", False),
    ],
)
def test_a_client_reference_reaches_only_a_verifier_that_treats_it_as_data(kind: str, taken: bool) -> None:
    refusal = client_reference_refusal(load_verifier(kind))
    assert (refusal is None) is taken
    if refusal is not None:
        assert f"'{kind}' runs what a reference holds" in refusal and "reference_is_data" in refusal


def test_a_researchers_verifier_takes_client_references_only_when_it_says_so() -> None:
    assert client_reference_refusal(Constant(1.0)) is not None
    declared = Constant(1.0)
    declared.reference_is_data = True  # type: ignore[attr-defined]
    assert client_reference_refusal(declared) is None


def test_a_range_names_what_is_wrong() -> None:
    unit = RewardRange()
    assert unit.problem(0.25) is None and unit.problem(1) is None
    assert unit.problem(True) == "reward True is not a number"
    assert "outside the task's reward range [0, 1]" in (unit.problem(2.0) or "")

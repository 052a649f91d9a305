"""A job's run rules (`rlsched.policy.run_rules`), as the config makes them (`config_params.run_rules`)."""

from __future__ import annotations

from rlsched.config import load_config
from rlsched.config_params import run_rules
from rlsched.policy.run_rules import RunRules


def test_the_config_makes_the_rules_from_its_sections() -> None:
    cfg = load_config(
        None, ["grpo.steps=7", "grpo.time_budget_s=60", "eval.every_steps=3", "checkpoint.every=2"]
    )
    assert run_rules(cfg) == RunRules(steps=7, time_budget_s=60.0, eval_every=3, checkpoint_every=2)


def test_time_budget_and_evaluation_cadence() -> None:
    rules = RunRules(steps=10, time_budget_s=60.0, eval_every=3, checkpoint_every=0)
    assert not rules.out_of_time(60.0) and rules.out_of_time(60.01)
    assert [i for i in range(1, 10) if rules.eval_due(i)] == [3, 6, 9]


def test_checkpoints_on_their_cadence_and_after_the_last_iteration() -> None:
    assert [i for i in range(1, 7) if RunRules(9, 1.0, 1, 2).checkpoint_due(i)] == [2, 4, 6]
    never = RunRules(9, 1.0, 1, 0)
    assert not any(never.checkpoint_due(i) for i in range(1, 7)) and never.checkpoint_due(3, last=True)


def test_an_update_waits_for_the_checkpoint_of_the_step_before_until_the_job_has_taken_it() -> None:
    rules = RunRules(steps=5, time_budget_s=1.0, eval_every=1, checkpoint_every=2)
    assert rules.update_held(3, stopping=False, asked=2)  # step 2's checkpoint not yet taken
    assert not rules.update_held(3, stopping=False, asked=3)  # the job asked for step 3: it was
    assert not rules.update_held(2, stopping=False, asked=1)  # no checkpoint after step 1
    assert rules.update_held(6, stopping=False, asked=6)  # past the last step
    assert rules.update_held(2, stopping=True, asked=2)  # the job means to stop

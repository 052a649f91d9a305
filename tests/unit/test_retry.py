"""The one retry policy (`rlsched.policy.retry`): how many attempts follow failures, and the backoff
between them, for every kind of work that retries."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlsched.config import JobConfig
from rlsched.config_params import retries
from rlsched.policy.retry import RetryPolicy


def test_retries_are_spent_after_the_last_one() -> None:
    policy = RetryPolicy(2)
    assert [policy.after(n) for n in (1, 2, 3)] == [0.0, 0.0, None]
    assert policy.attempts == 3 and policy.gives_up(3) and not policy.gives_up(2)
    assert RetryPolicy(0).gives_up(1)  # no retry: the first failure is final


def test_the_backoff_doubles_up_to_its_ceiling() -> None:
    policy = RetryPolicy(None, base_s=1.0, max_s=5.0)
    assert [policy.after(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.attempts is None and not policy.gives_up(10_000)


def test_bad_settings_and_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        RetryPolicy(-1)
    with pytest.raises(ValueError, match="negative"):
        RetryPolicy(1, base_s=-1.0)
    with pytest.raises(ValueError, match="counts from 1"):
        RetryPolicy(1).after(0)


@given(st.integers(0, 20), st.integers(1, 40), st.floats(0, 100), st.floats(0, 1e4))
def test_waits_never_shrink_never_pass_the_ceiling_and_stop_at_the_limit(
    limit: int, n: int, base: float, most: float
) -> None:
    policy = RetryPolicy(limit, base, most)
    a, b = policy.after(n), policy.after(n + 1)
    assert (a is None) == (n > limit)
    if a is not None and b is not None:
        assert a <= b <= most
    if a is None:
        assert b is None  # once given up, never again


def test_a_jobs_settings_become_its_policies() -> None:
    cfg = JobConfig.model_validate({"weights": {"pull_retries": 3}, "eval": {"retries": 0}})
    r = retries(cfg)
    assert r.weight_pull.attempts == 4 and r.evaluation.gives_up(1)
    assert r.recovery == RetryPolicy(cfg.checkpoint.max_recoveries)
    assert math.isinf(r.weight_pull.max_s)

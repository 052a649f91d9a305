"""Remaining-time estimator: exact on small discrete distributions, never negative, censoring-aware."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.estimate import EstimatorParams, RemainingTime

durations = st.lists(st.integers(min_value=0, max_value=50).map(float), min_size=1, max_size=40)


def fed(values: list[float], censored: list[float] = (), **params: int) -> RemainingTime:  # type: ignore[assignment]
    est = RemainingTime(EstimatorParams(window=1000, min_observations=1, **params))
    for v in values:
        est.observe("code", "p", v)
    for c in censored:
        est.observe("code", "p", c, censored=True)
    return est


def test_spec_nine_short_one_long() -> None:
    est = fed([1.0] * 9 + [100.0])
    assert est.remaining("code", "p") == pytest.approx(10.9)
    assert est.remaining("code", "p", elapsed=10.0) == pytest.approx(90.0)
    assert est.quantile("code", "p", 0.5) == pytest.approx(1.0)
    assert est.quantile("code", "p", 0.95) == pytest.approx(100.0)
    assert est.quantile("code", "p", 0.5, elapsed=10.0) == pytest.approx(90.0)


@settings(max_examples=200, deadline=None)
@given(durations, st.floats(min_value=0, max_value=60))
def test_exact_on_discrete_distributions_and_never_negative(values: list[float], elapsed: float) -> None:
    est = fed(values)
    survivors = [v - elapsed for v in values if v > elapsed]
    got = est.remaining("code", "p", elapsed)
    assert got >= 0
    if survivors:
        assert got == pytest.approx(sum(survivors) / len(survivors))
    else:
        assert got == pytest.approx(elapsed)  # past all history: as much again (Lindy)
    for p in (0.1, 0.5, 0.9, 0.99):
        assert est.quantile("code", "p", p, elapsed) >= 0


@settings(max_examples=200, deadline=None)
@given(durations, st.lists(st.integers(min_value=0, max_value=50).map(float), min_size=1, max_size=10))
def test_censored_runs_never_shorten_the_estimate(values: list[float], stopped: list[float]) -> None:
    """A run stopped at c says S > c: counting it as a finish at c would under-estimate the mean."""
    as_finished = fed(values + stopped).remaining("code", "p")
    censored = fed(values, stopped).remaining("code", "p")
    assert censored >= as_finished - 1e-9


def test_censoring_before_every_finish_changes_nothing_and_after_raises_the_tail() -> None:
    assert fed([2.0, 4.0], censored=[1.0]).remaining("code", "p") == pytest.approx(3.0)
    # 1, 2, 3 finished and one stopped at 5 s: S = 3/4, 1/2, 1/4 at 1, 2, 3 and 1/4 survives past 5 s
    # with a Pareto(5, 2) tail (5 s more on average): mean = 1 + .75 + .5 + .25 * 2 + .25 * 5 = 4
    est = fed([1.0, 2.0, 3.0], censored=[5.0])
    assert est.remaining("code", "p") == pytest.approx(4.0)
    assert est.remaining("code", "p", elapsed=3.5) == pytest.approx(6.5)


def test_falls_back_from_key_to_kind_to_prior() -> None:
    est = RemainingTime(EstimatorParams(min_observations=2, prior_mean_s=7.0))
    assert est.estimate("code", "p1").source == "prior" and est.remaining("code", "p1") == 7.0
    est.observe("code", "p1", 1.0)
    est.observe("code", "p2", 3.0)
    assert est.estimate("code", "p1").source == "kind" and est.remaining("code", "p1") == pytest.approx(2.0)
    est.observe("code", "p1", 1.0)
    assert est.estimate("code", "p1").source == "key" and est.remaining("code", "p1") == pytest.approx(1.0)
    assert est.estimate("math", "p1").source == "prior"


def test_memory_is_bounded() -> None:
    est = RemainingTime(EstimatorParams(window=4, min_observations=1, max_keys=10))
    for v in (100.0, 100.0, 1.0, 1.0, 1.0, 1.0):
        est.observe("code", "p", v)
    assert est.remaining("code", "p") == pytest.approx(1.0)  # the window forgot the old 100 s runs
    for k in range(50):
        est.observe("code", f"k{k}", 5.0)
    assert len(est._by_key) == 10


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_bad_observations_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        RemainingTime().observe("code", "p", bad)


def test_a_sibling_running_long_lifts_the_estimate_until_the_key_has_history() -> None:
    est = RemainingTime(EstimatorParams(min_observations=2))
    for _ in range(9):
        est.observe("code", "other", 1.0)
    est.observe("code", "other", 100.0)  # the kind: nine of 1 s, one of 100 s
    assert est.remaining("code", "slow") == pytest.approx(10.9)  # nothing known of this key yet
    est.running_for("code", "slow", "run-1", 10.0)  # a sibling has run 10 s without finishing
    got = est.estimate("code", "slow")
    assert got.source == "kind+running" and got.remaining_s == pytest.approx(100.0)  # 10 + 90 left
    assert est.quantile("code", "slow", 0.5) == pytest.approx(100.0)
    est.observe("code", "slow", 100.0, run_id="run-1")  # it finished: the provisional bound goes
    assert est.estimate("code", "slow").source == "kind"

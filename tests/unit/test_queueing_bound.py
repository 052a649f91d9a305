"""The batch lower bound used by the verification benchmark: valid, and tight where it should be."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.queueing import arrival_aware_bound, fcfs


def test_spec_exercise_and_work_bound() -> None:
    assert arrival_aware_bound([0, 6, 12], [10, 2, 8], 1) == 20  # one worker in arrival order: 20
    assert arrival_aware_bound([0, 6, 12], [10, 2, 80], 2) == 92  # the last sample decides
    assert arrival_aware_bound([0] * 80, [1] * 80, 48) == pytest.approx(80 / 48)  # work over workers


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=30),
    st.integers(1, 5),
)
def test_no_fcfs_schedule_beats_it(jobs: list[tuple[int, int]], workers: int) -> None:
    arrivals, services = [float(a) for a, _ in jobs], [float(s) for _, s in jobs]
    assert (
        fcfs(arrivals, services, workers).completion
        >= arrival_aware_bound(arrivals, services, workers) - 1e-9
    )

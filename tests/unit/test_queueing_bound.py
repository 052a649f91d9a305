"""The batch lower bound used by the verification benchmark: valid, and tight where it should be."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.queueing import arrival_aware_bound, fcfs


def test_spec_exercise_and_work_bound() -> None:
    assert arrival_aware_bound([0, 6, 12], [10, 2, 8], 1) == 20  # one worker in arrival order: 20
    assert arrival_aware_bound([0, 6, 12], [10, 2, 80], 2) == 92  # the last sample decides
    assert arrival_aware_bound([0] * 40, [1] * 40, 48) == 1  # fewer samples than workers
    assert arrival_aware_bound([0] * 80, [1] * 80, 48) == 2  # some worker runs two: the SPEC's 2 s
    assert arrival_aware_bound([0] * 96, [1] * 96, 96) == 1
    assert arrival_aware_bound([0.0] * 10, [1.0] * 9 + [100.0], 4) == 100  # the long one decides


def _optimum(arrivals: list[float], services: list[float], workers: int) -> float:
    """The best non-preemptive makespan, by trying every assignment of samples to workers (on one
    worker, earliest arrival first is optimal for the makespan)."""
    best = math.inf
    for assign in itertools.product(range(workers), repeat=len(arrivals)):
        end = 0.0
        for w in range(workers):
            t = 0.0
            for a, s in sorted((arrivals[i], services[i]) for i in range(len(assign)) if assign[i] == w):
                t = max(t, a) + s
            end = max(end, t)
        best = min(best, end)
    return best


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10), st.integers(0, 10)), min_size=1, max_size=6),
    st.integers(1, 3),
)
def test_no_schedule_at_all_beats_it(jobs: list[tuple[int, int]], workers: int) -> None:
    arrivals, services = [float(a) for a, _ in jobs], [float(s) for _, s in jobs]
    assert _optimum(arrivals, services, workers) >= arrival_aware_bound(arrivals, services, workers) - 1e-9


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

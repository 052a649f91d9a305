"""The incremental dispatch queue gives exactly the order `decide` gives, under every clock-free policy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.dispatch_queue import DispatchQueue
from rlsched.policy.estimate import EstimatorParams, RemainingTime
from rlsched.policy.verify import (
    BatchId,
    Dispatch,
    DispatchPolicy,
    PendingVerification,
    TaskId,
    VerifyParams,
    VerifySnapshot,
    WorkerId,
    WorkerSlot,
    decide,
)

KEYS = ["a", "b", "c", "d"]
op = st.one_of(
    st.tuples(st.just("push"), st.sampled_from(KEYS), st.sampled_from([0.0, 0.0, 2.0]), st.booleans()),
    st.tuples(st.just("observe"), st.sampled_from(KEYS), st.integers(1, 40).map(float), st.booleans()),
    st.tuples(st.just("pop"), st.integers(1, 4), st.just(0.0), st.just(False)),
    st.tuples(st.just("discard"), st.integers(0, 30), st.just(0.0), st.just(False)),
    st.tuples(st.just("running"), st.sampled_from(KEYS), st.integers(1, 60).map(float), st.booleans()),
)


@pytest.mark.parametrize("policy", [p for p in DispatchPolicy])
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=60))
def test_same_order_as_decide(policy: DispatchPolicy, ops: list[tuple[str, object, float, bool]]) -> None:
    est = RemainingTime(EstimatorParams(min_observations=2, prior_mean_s=3.0))
    params = VerifyParams(policy)
    queue = DispatchQueue(params, est)
    pending: dict[TaskId, PendingVerification] = {}
    clock = 0.0
    for n, (name, arg, value, flag) in enumerate(ops):
        clock += 0.5
        if name == "push":
            kind = "code" if flag else "math"
            task = PendingVerification(
                TaskId(f"t{n}"), BatchId("b0"), clock, kind=kind, key=str(arg), elapsed=value
            )
            queue.push(task)
            pending[task.task_id] = task
        elif name == "observe":
            kind = "code" if flag else "math"
            est.observe(kind, str(arg), value, run_id=f"run-{n % 3}")
            queue.observed(kind, str(arg))
        elif name == "running":  # a run of this key has gone on this long (the simulator's report)
            kind = "code" if flag else "math"
            est.running_for(kind, str(arg), f"run-{n % 3}", value)
            queue.observed(kind, str(arg))
        elif name == "discard":
            victim = TaskId(f"t{arg}")
            assert (queue.discard(victim) is not None) == (victim in pending)
            pending.pop(victim, None)
        else:
            free = tuple(WorkerSlot(WorkerId(f"w{k}")) for k in range(int(arg)))
            want = [
                d.task_id
                for d in decide(VerifySnapshot(tuple(pending.values()), free, estimator=est), clock, params)
                if isinstance(d, Dispatch)
            ]
            got = [
                t.task_id for t in (queue.pop() for _ in range(min(int(arg), len(queue)))) if t is not None
            ]
            assert got == want
            for t in got:
                del pending[t]
        assert len(queue) == len(pending)
    assert not queue.needs_decide


def test_several_batches_under_distrs_need_the_full_decision() -> None:
    queue = DispatchQueue(VerifyParams(DispatchPolicy.DISTRS), RemainingTime())
    queue.push(PendingVerification(TaskId("x"), BatchId("b0"), 0.0))
    assert not queue.needs_decide
    queue.push(PendingVerification(TaskId("y"), BatchId("b1"), 0.0))
    assert queue.needs_decide and {t.task_id for t in queue.tasks()} == {"x", "y"}
    queue.discard(TaskId("y"))
    assert not queue.needs_decide
    with pytest.raises(ValueError, match="already queued"):
        queue.push(PendingVerification(TaskId("x"), BatchId("b0"), 1.0))

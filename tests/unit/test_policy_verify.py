"""Verification dispatch: FIFO table-driven; sjf, lrpt and distrs by their estimates; pool advice."""

from __future__ import annotations

import copy

import pytest

from rlsched.policy.estimate import EstimatorParams, RemainingTime
from rlsched.policy.verify import (
    BatchId,
    BatchState,
    Dispatch,
    DispatchPolicy,
    PendingVerification,
    TaskId,
    VerifyParams,
    VerifySnapshot,
    Wait,
    WorkerId,
    WorkerSlot,
    advise_pool,
    batch_deadlines,
    decide,
    deferral_net,
    latest_start,
)


def pending(tid: str, arrival: float) -> PendingVerification:
    return PendingVerification(TaskId(tid), BatchId("b0"), arrival)


def slot(wid: str, running: str | None = None) -> WorkerSlot:
    return WorkerSlot(WorkerId(wid), TaskId(running) if running else None)


@pytest.mark.parametrize(
    "tasks, workers, expected",
    [
        ([], [slot("w0")], []),
        ([pending("a", 1.0)], [slot("w0")], [Dispatch(TaskId("a"), WorkerId("w0"))]),
        (  # oldest first, whatever the order they are listed in
            [pending("late", 5.0), pending("early", 1.0)],
            [slot("w0")],
            [
                Dispatch(TaskId("early"), WorkerId("w0")),
                Wait((TaskId("late"),), "the 1 free verifier worker(s) went to more urgent work"),
            ],
        ),
        (  # a busy slot takes nothing until its occupant's exit is observed
            [pending("a", 1.0), pending("b", 2.0)],
            [slot("w0", running="x"), slot("w1")],
            [
                Dispatch(TaskId("a"), WorkerId("w1")),
                Wait((TaskId("b"),), "the 1 free verifier worker(s) went to more urgent work"),
            ],
        ),
        (  # nothing free: one Wait naming every task, in order
            [pending("b", 2.0), pending("a", 1.0)],
            [slot("w0", running="x")],
            [Wait((TaskId("a"), TaskId("b")), "no verifier worker is free")],
        ),
        (  # ties broken by id: a total, reproducible order
            [pending("b", 1.0), pending("a", 1.0)],
            [slot("w0"), slot("w1")],
            [Dispatch(TaskId("a"), WorkerId("w0")), Dispatch(TaskId("b"), WorkerId("w1"))],
        ),
    ],
)
def test_fifo(tasks: list[PendingVerification], workers: list[WorkerSlot], expected: list[object]) -> None:
    snap = VerifySnapshot(tuple(tasks), tuple(workers))
    before = copy.deepcopy(snap)
    assert list(decide(snap, now=10.0, params=VerifyParams())) == expected
    assert snap == before


def _estimator(history: dict[str, list[float]]) -> RemainingTime:
    est = RemainingTime(EstimatorParams(min_observations=1))
    for key, values in history.items():
        for v in values:
            est.observe("code", key, v)
    return est


def _task(tid: str, batch: str, arrival: float, key: str) -> PendingVerification:
    return PendingVerification(TaskId(tid), BatchId(batch), arrival, kind="code", key=key)


HISTORY = {"short": [1.0, 1.0], "long": [30.0, 30.0], "mid": [5.0, 5.0]}


@pytest.mark.parametrize(
    "policy, first",
    [
        (DispatchPolicy.FIFO, "a"),
        (DispatchPolicy.SJF, "c"),
        (DispatchPolicy.LRPT, "b"),
        (DispatchPolicy.DISTRS, "b"),  # one batch: the longest must start first to end soonest
    ],
)
def test_each_policy_picks_its_first(policy: DispatchPolicy, first: str) -> None:
    tasks = (_task("a", "b0", 0.0, "mid"), _task("b", "b0", 1.0, "long"), _task("c", "b0", 2.0, "short"))
    snap = VerifySnapshot(tasks, (slot("w0"),), estimator=_estimator(HISTORY))
    decisions = decide(snap, 3.0, VerifyParams(policy))
    assert decisions[0] == Dispatch(TaskId(first), WorkerId("w0"))
    assert isinstance(decisions[1], Wait) and len(decisions[1].task_ids) == 2


def test_distrs_serves_the_batch_that_must_start_first_and_breaks_ties_by_idle_cost() -> None:
    est = _estimator(HISTORY)
    # batch x: its last sample is still generating until t=100, so its work here has slack;
    # batch y: all arrived; its long verification decides when its 64-GPU group can resume
    batches = (
        BatchState(BatchId("x"), cost_rate=8, outstanding=4, generation_end=100.0, kind="code"),
        BatchState(BatchId("y"), cost_rate=64),
    )
    tasks = (_task("x1", "x", 0.0, "long"), _task("y1", "y", 5.0, "mid"))
    snap = VerifySnapshot(tasks, (slot("w0"),), batches=batches, estimator=est, pool_size=4)
    assert decide(snap, 6.0, VerifyParams(DispatchPolicy.DISTRS))[0] == Dispatch(TaskId("y1"), WorkerId("w0"))
    assert decide(snap, 6.0, VerifyParams(DispatchPolicy.LRPT))[0] == Dispatch(TaskId("x1"), WorkerId("w0"))
    # two identical batches: the one whose idle group costs more goes first
    same = (BatchState(BatchId("p"), cost_rate=16), BatchState(BatchId("q"), cost_rate=64))
    tasks = (_task("p1", "p", 0.0, "mid"), _task("q1", "q", 0.0, "mid"))
    snap = VerifySnapshot(tasks, (slot("w0"),), batches=same, estimator=est, pool_size=1)
    deadlines = batch_deadlines(snap, 0.0, VerifyParams(DispatchPolicy.DISTRS))
    assert deadlines[BatchId("p")] == deadlines[BatchId("q")]
    assert decide(snap, 0.0, VerifyParams(DispatchPolicy.DISTRS))[0].task_id == TaskId("q1")  # type: ignore[union-attr]


def test_spec_latest_start_and_deferral() -> None:
    assert latest_start(completion=120.0, need_s=100.0, prep_s=5.0) == (20.0, 15.0)
    assert deferral_net(saved_device_s=60.0, group_devices=64, delay_s=2.0) == -68.0
    assert deferral_net(saved_device_s=60.0, group_devices=16, delay_s=2.0) == 28.0


def test_pool_advice_shrinks_only_where_the_deadline_leaves_slack() -> None:
    est = _estimator({"short": [1.0] * 4})
    # 8 short verifications now, and the batch cannot finish before its last sample at t=50:
    # one worker clears them long before, so 32 workers would idle
    slack = VerifySnapshot(
        tuple(_task(f"t{k}", "b", 0.0, "short") for k in range(8)),
        (),
        batches=(BatchState(BatchId("b"), cost_rate=64, outstanding=1, generation_end=50.0, kind="code"),),
        estimator=est,
    )
    advice = advise_pool(slack, 0.0, VerifyParams(DispatchPolicy.DISTRS), max_workers=32)
    assert advice.workers == 1 and "as early as all of them" in advice.reason
    assert advice.predicted_completion[BatchId("b")] == pytest.approx(51.0)
    # the same work with everything arrived and a 64-GPU group waiting: every worker is worth it
    urgent = VerifySnapshot(
        tuple(_task(f"t{k}", "b", 0.0, "short") for k in range(32)),
        (),
        batches=(BatchState(BatchId("b"), cost_rate=64),),
        estimator=est,
    )
    assert advise_pool(urgent, 0.0, VerifyParams(DispatchPolicy.DISTRS), max_workers=32).workers == 32

"""FIFO verification dispatch: pure, table-driven, never mutates its input."""

from __future__ import annotations

import copy

import pytest

from rlsched.policy.verify import (
    BatchId,
    Dispatch,
    PendingVerification,
    TaskId,
    VerifyParams,
    VerifySnapshot,
    Wait,
    WorkerId,
    WorkerSlot,
    decide,
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
                Wait((TaskId("late"),), "the 1 free verifier worker(s) went to earlier work"),
            ],
        ),
        (  # a busy slot takes nothing until its occupant's exit is observed
            [pending("a", 1.0), pending("b", 2.0)],
            [slot("w0", running="x"), slot("w1")],
            [
                Dispatch(TaskId("a"), WorkerId("w1")),
                Wait((TaskId("b"),), "the 1 free verifier worker(s) went to earlier work"),
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

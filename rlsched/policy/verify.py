"""Verification dispatch: which pending verification goes to which free worker, now.

Each sample is handed to this policy the moment it exists; the runtime calls `decide` whenever a
sample arrives or a worker frees up, and acts on the decisions it returns. Only `fifo` exists today:
arrival order, oldest first, one verification per free worker. The verification-scheduling issue adds
policies (shortest expected first, DistRS-style latest start time) as further named orderings chosen
by `DispatchPolicy`; the snapshot already carries what they need (arrival, batch, attempt, kind).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

TaskId = NewType("TaskId", str)
WorkerId = NewType("WorkerId", str)
BatchId = NewType("BatchId", str)


class DispatchPolicy(StrEnum):
    FIFO = "fifo"


@dataclass(frozen=True)
class PendingVerification:
    task_id: TaskId
    batch_id: BatchId
    arrival: float  # when the sample finished generating (injected clock)
    attempt: int = 0  # retries of an execution fault come back with attempt + 1
    kind: str = "default"


@dataclass(frozen=True)
class WorkerSlot:
    worker_id: WorkerId
    running: TaskId | None = None  # a slot is free only once its previous occupant's exit was observed

    @property
    def free(self) -> bool:
        return self.running is None


@dataclass(frozen=True)
class VerifySnapshot:
    pending: tuple[PendingVerification, ...]
    workers: tuple[WorkerSlot, ...]


@dataclass(frozen=True)
class VerifyParams:
    policy: DispatchPolicy = DispatchPolicy.FIFO


@dataclass(frozen=True)
class Dispatch:
    task_id: TaskId
    worker_id: WorkerId


@dataclass(frozen=True)
class Wait:
    """Verifications not dispatched now, and why (an expected "no", returned as a value).

    One value per reason, not per task: a queue of thousands costs one tuple, not thousands of
    objects, on every decision."""

    task_ids: tuple[TaskId, ...]
    reason: str


Decision = Dispatch | Wait


def fifo_order(pending: Sequence[PendingVerification]) -> list[PendingVerification]:
    """Oldest arrival first; ties broken by task id so the order is total and reproducible."""
    return sorted(pending, key=lambda p: (p.arrival, p.task_id))


def _ordered(pending: Sequence[PendingVerification], policy: DispatchPolicy) -> list[PendingVerification]:
    match policy:
        case DispatchPolicy.FIFO:
            return fifo_order(pending)


def decide(snapshot: VerifySnapshot, now: float, params: VerifyParams) -> tuple[Decision, ...]:
    """Pair the best-ordered pending verifications with free workers; the rest wait."""
    del now  # fifo needs no clock; deadline-aware policies will
    free = [w.worker_id for w in snapshot.workers if w.free]
    ordered = _ordered(snapshot.pending, params.policy)
    decisions: list[Decision] = [Dispatch(t.task_id, w) for t, w in zip(ordered, free, strict=False)]
    if len(ordered) > len(free):
        reason = (
            f"the {len(free)} free verifier worker(s) went to earlier work"
            if free
            else "no verifier worker is free"
        )
        decisions.append(Wait(tuple(t.task_id for t in ordered[len(free) :]), reason))
    return tuple(decisions)

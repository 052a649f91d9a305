"""Verification dispatch: which pending verification goes to which free worker, now.

Each sample is handed to this policy the moment it exists; the runtime and the simulator call
`decide(snapshot, now, params)` whenever a sample arrives or a worker frees up, and act on the
decisions it returns. The policies, chosen by `DispatchPolicy`:

- `fifo`: arrival order, oldest first.
- `sjf`: shortest expected remaining time first (good for mean latency, bad for a batch's tail).
- `lrpt`: longest expected remaining time first (the classic makespan rule).
- `distrs`, our design (request in, batch out): each batch (an iteration of a job, waited on by its
  training group) gets a predicted completion `D_b` from its running, queued and not-yet-generated
  samples' conditional remaining times and its share of the pool; each queued verification's latest
  start is `D_b - q(S_i) - prep` (SPEC: a job needing at most 100 s in a batch ending at 120 s starts
  by 20 s; with 5 s of preparation, preparation starts by 15 s); work runs in latest-start order, ties
  to the batch whose idle training group costs most. `advise_pool` sizes the pool over time: the
  fewest workers whose predicted completions cost no more, in device-seconds of idle training groups,
  than the worker-seconds they save (SPEC: 60 GPU-s saved against a 64-GPU group idle 2 s more is a
  net loss of 68; with 16 GPUs a net gain of 28).

Estimates come from `rlsched.policy.estimate.RemainingTime` in the snapshot; without one every
verification is estimated alike and the estimate-driven policies fall back to arrival order.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

from rlsched.policy.estimate import RemainingTime

TaskId = NewType("TaskId", str)
WorkerId = NewType("WorkerId", str)
BatchId = NewType("BatchId", str)


class DispatchPolicy(StrEnum):
    FIFO = "fifo"
    SJF = "sjf"
    LRPT = "lrpt"
    DISTRS = "distrs"


@dataclass(frozen=True)
class PendingVerification:
    task_id: TaskId
    batch_id: BatchId
    arrival: float  # when the sample finished generating (injected clock)
    attempt: int = 0  # retries and preempted runs come back with attempt + 1
    kind: str = "default"  # the verifier kind
    key: str = ""  # the problem or test id whose history predicts this one
    elapsed: float = 0.0  # service already received by earlier, preempted attempts


@dataclass(frozen=True)
class RunningVerification:
    task_id: TaskId
    batch_id: BatchId
    started: float
    kind: str = "default"
    key: str = ""
    elapsed_before: float = 0.0


@dataclass(frozen=True)
class WorkerSlot:
    worker_id: WorkerId
    running: TaskId | None = None  # a slot is free only once its previous occupant's exit was observed

    @property
    def free(self) -> bool:
        return self.running is None


@dataclass(frozen=True)
class BatchState:
    """What a batch's training group is waiting for, beyond the verifications already known."""

    batch_id: BatchId
    cost_rate: float = 1.0  # devices of the training group left idle while this batch is incomplete
    outstanding: int = 0  # samples still being generated
    generation_end: float | None = None  # when the last of them is expected (injected clock)
    kind: str = "default"  # verifier kind of the outstanding samples
    prep_s: float = 0.0  # preparation before a verification can start (e.g. a sandbox)


@dataclass(frozen=True)
class VerifySnapshot:
    pending: tuple[PendingVerification, ...]
    workers: tuple[WorkerSlot, ...]
    running: tuple[RunningVerification, ...] = ()
    batches: tuple[BatchState, ...] = ()
    estimator: RemainingTime | None = None
    pool_size: int | None = None  # workers in the whole pool, when `workers` shows only free ones


@dataclass(frozen=True)
class VerifyParams:
    policy: DispatchPolicy = DispatchPolicy.FIFO
    quantile: float = 0.9  # distrs plans each verification for this quantile of its remaining time


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


def _remaining(snapshot: VerifySnapshot, p: PendingVerification) -> float:
    est = snapshot.estimator
    return 1.0 if est is None else est.remaining(p.kind, p.key, p.elapsed)


def _by_remaining(snapshot: VerifySnapshot, longest_first: bool) -> list[PendingVerification]:
    sign = -1.0 if longest_first else 1.0
    return sorted(snapshot.pending, key=lambda p: (sign * _remaining(snapshot, p), p.arrival, p.task_id))


def _coarse(elapsed: float) -> float:
    """Elapsed time rounded to about 2% (64 steps per doubling), so the estimator's memo answers
    the running verifications from one decision to the next instead of recomputing each."""
    if elapsed <= 0.0:
        return 0.0
    return float(2.0 ** (round(math.log2(elapsed) * 32) / 32))


def batch_deadlines(snapshot: VerifySnapshot, now: float, params: VerifyParams) -> dict[BatchId, float]:
    """Each batch's predicted completion: no sooner than its longest known piece of work (a running
    run's remaining time, a queued run's planned time, the last generation plus a verification),
    nor than its share of the pool could clear its expected work."""
    est, q = snapshot.estimator, params.quantile
    plan: dict[BatchId, float] = {}
    work: dict[BatchId, float] = {}

    def add(batch: BatchId, end: float, expected: float) -> None:
        plan[batch] = max(plan.get(batch, now), end)
        work[batch] = work.get(batch, 0.0) + expected

    for r in snapshot.running:
        e = _coarse(now - r.started + r.elapsed_before)
        left = 1.0 if est is None else est.remaining(r.kind, r.key, e)
        add(r.batch_id, now + left, left)
    alike = Counter((p.batch_id, p.kind, p.key, p.elapsed) for p in snapshot.pending)
    for (batch, kind, key, elapsed), count in alike.items():  # one estimate per kind of work
        planned = 1.0 if est is None else est.quantile(kind, key, q, elapsed)
        add(batch, now + planned, count * (1.0 if est is None else est.remaining(kind, key, elapsed)))
    for b in snapshot.batches:
        if b.outstanding > 0:
            one = 1.0 if est is None else est.quantile(b.kind, "", q)
            mean = 1.0 if est is None else est.remaining(b.kind, "")
            add(b.batch_id, max(now, b.generation_end or now) + b.prep_s + one, b.outstanding * mean)
    pool = snapshot.pool_size or len(snapshot.workers) or 1
    total = sum(work.values())
    return {b: max(end, now + total / pool) if total else end for b, end in plan.items()}


def latest_start(completion: float, need_s: float, prep_s: float = 0.0) -> tuple[float, float]:
    """When work needing `need_s` (after `prep_s` of preparation) must start to end by `completion`:
    (start of the work, start of its preparation)."""
    start = completion - need_s
    return start, start - prep_s


def _distrs_order(snapshot: VerifySnapshot, now: float, params: VerifyParams) -> list[PendingVerification]:
    if len({p.batch_id for p in snapshot.pending}) == 1:  # one deadline: latest-start order is
        deadlines = {p.batch_id: 0.0 for p in snapshot.pending[:1]}  # longest planned time first
    else:
        deadlines = batch_deadlines(snapshot, now, params)
    info = {b.batch_id: b for b in snapshot.batches}
    est, q = snapshot.estimator, params.quantile
    needs: dict[tuple[str, str, float], float] = {}

    def key(p: PendingVerification) -> tuple[float, float, float, str]:
        need = needs.get((p.kind, p.key, p.elapsed))
        if need is None:
            need = 1.0 if est is None else est.quantile(p.kind, p.key, q, p.elapsed)
            needs[(p.kind, p.key, p.elapsed)] = need
        batch = info.get(p.batch_id, BatchState(p.batch_id))
        start, _ = latest_start(deadlines[p.batch_id], need, batch.prep_s)
        return (start, -batch.cost_rate, p.arrival, p.task_id)

    return sorted(snapshot.pending, key=key)


def _ordered(snapshot: VerifySnapshot, now: float, params: VerifyParams) -> list[PendingVerification]:
    match params.policy:
        case DispatchPolicy.FIFO:
            return fifo_order(snapshot.pending)
        case DispatchPolicy.SJF:
            return _by_remaining(snapshot, longest_first=False)
        case DispatchPolicy.LRPT:
            return _by_remaining(snapshot, longest_first=True)
        case DispatchPolicy.DISTRS:
            return _distrs_order(snapshot, now, params)


def decide(snapshot: VerifySnapshot, now: float, params: VerifyParams) -> tuple[Decision, ...]:
    """Pair the best-ordered pending verifications with free workers; the rest wait."""
    free = [w.worker_id for w in snapshot.workers if w.free]
    if not snapshot.pending:
        return ()
    ordered = _ordered(snapshot, now, params)
    decisions: list[Decision] = [Dispatch(t.task_id, w) for t, w in zip(ordered, free, strict=False)]
    if len(ordered) > len(free):
        reason = (
            f"the {len(free)} free verifier worker(s) went to more urgent work"
            if free
            else "no verifier worker is free"
        )
        decisions.append(Wait(tuple(t.task_id for t in ordered[len(free) :]), reason))
    return tuple(decisions)


# -- pool size over time ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolAdvice:
    workers: int
    predicted_completion: dict[BatchId, float]
    reason: str


def _list_schedule(
    now: float, busy_until: Sequence[float], jobs: Sequence[tuple[BatchId, float, float]], workers: int
) -> dict[BatchId, float]:
    """Each batch's completion if `jobs` (batch, release time, seconds), in order, ran greedily on
    `workers` workers, the running work first (it is never stopped to shrink the pool)."""
    free = [*busy_until, *([now] * max(0, workers - len(busy_until)))]
    heapq.heapify(free)
    done: dict[BatchId, float] = {}
    for batch, release, seconds in jobs:
        start = max(release, heapq.heappop(free))
        heapq.heappush(free, start + seconds)
        done[batch] = max(done.get(batch, now), start + seconds)
    return done


def deferral_net(saved_device_s: float, group_devices: float, delay_s: float) -> float:
    """Net device-seconds saved by deferring: what the pool saves minus what the idle group loses."""
    return saved_device_s - group_devices * delay_s


def advise_pool(
    snapshot: VerifySnapshot, now: float, params: VerifyParams, max_workers: int, worker_cost: float = 1.0
) -> PoolAdvice:
    """The pool size that minimises worker-seconds plus the training groups' idle device-seconds for
    the work now known (running, queued, and outstanding samples at their expected times), trying
    sizes on a doubling ladder up to `max_workers`. `worker_cost` weighs one worker-second against
    one device-second of an idle training group (a CPU core is cheaper than a GPU)."""
    est = snapshot.estimator
    busy = sorted(
        now
        + (1.0 if est is None else est.remaining(r.kind, r.key, _coarse(now - r.started + r.elapsed_before)))
        for r in snapshot.running
    )
    ordered = _distrs_order(snapshot, now, params)
    jobs = [(p.batch_id, now, _remaining(snapshot, p)) for p in ordered]
    for b in snapshot.batches:  # outstanding samples arrive by the end of generation, say at its end
        mean = 1.0 if est is None else est.remaining(b.kind, "")
        release = max(now, b.generation_end or now) + b.prep_s
        jobs += [(b.batch_id, release, mean)] * b.outstanding
    rates = {b.batch_id: b.cost_rate for b in snapshot.batches}
    floor = max(1, len(busy))
    ladder = sorted({floor, max_workers} | {w for w in (2**k for k in range(16)) if floor < w < max_workers})

    def cost(w: int) -> tuple[float, dict[BatchId, float]]:
        done = _list_schedule(now, busy, jobs, w)
        end = max(done.values(), default=now)
        idle = sum(rates.get(b, 1.0) * (t - now) for b, t in done.items())
        return worker_cost * w * (end - now) + idle, done

    costs = {w: cost(w) for w in ladder}
    best = min(ladder, key=lambda w: (costs[w][0], w))
    done, full = costs[best][1], costs[max_workers][1]
    delay = max((done[b] - full[b] for b in done), default=0.0)
    if best == max_workers:
        reason = f"all {max_workers} workers: each one shortens what the training groups wait for"
    elif delay <= 1e-9:
        reason = f"{best} of {max_workers} workers finish every batch as early as all of them would"
    else:
        reason = (
            f"{best} of {max_workers} workers: finishing {delay:.3g} s later than with all of them "
            "costs the waiting training groups less than the workers it frees"
        )
    return PoolAdvice(best, done, reason)

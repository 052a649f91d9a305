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


@dataclass(slots=True)  # a value, never changed (`replace` makes another); not frozen: a frozen
class PendingVerification:  # dataclass's __init__ costs 3x, and the simulator makes one per sample
    task_id: TaskId
    batch_id: BatchId
    arrival: float  # when the sample finished generating (injected clock)
    attempt: int = 0  # retries and preempted runs come back with attempt + 1
    kind: str = "default"  # the verifier kind
    key: str = ""  # the problem or test id whose history predicts this one
    elapsed: float = 0.0  # service already received by earlier, preempted attempts
    slots: int = 1  # a gang verification needs this many workers at once, all or none


@dataclass(frozen=True)
class RunningVerification:
    task_id: TaskId
    batch_id: BatchId
    started: float
    kind: str = "default"
    key: str = ""
    elapsed_before: float = 0.0
    slots: int = 1
    worker_id: WorkerId | None = None  # where it runs (needed to preempt it)
    attempt: int = 0


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
    preempt: bool = False  # distrs: stop deferrable work of cheaper batches for urgent work


@dataclass(frozen=True)
class Dispatch:
    task_id: TaskId
    worker_id: WorkerId  # the worker that runs it
    gang: tuple[WorkerId, ...] = ()  # the other workers it holds at once (a gang verification)


@dataclass(frozen=True)
class Preempt:
    """Stop a running verification so that urgent work gets its worker. The stopped run is requeued
    with attempt + 1, to run again from the start (a verification cannot resume), and its elapsed
    time is recorded as a censored observation of its key."""

    task_id: TaskId
    worker_id: WorkerId
    for_task: TaskId
    reason: str


@dataclass(frozen=True)
class Wait:
    """Verifications not dispatched now, and why (an expected "no", returned as a value).

    One value per reason, not per task: a queue of thousands costs one tuple, not thousands of
    objects, on every decision."""

    task_ids: tuple[TaskId, ...]
    reason: str


Decision = Dispatch | Wait | Preempt


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


def _batch_plans(
    snapshot: VerifySnapshot, now: float, params: VerifyParams
) -> tuple[dict[BatchId, float], float]:
    """Each batch's longest known piece of work (a running run's remaining time, a queued run's
    planned time, the last generation plus a verification), and the expected work of all batches."""
    est, q = snapshot.estimator, params.quantile
    plan: dict[BatchId, float] = {}
    total = 0.0

    def add(batch: BatchId, end: float, expected: float) -> None:
        nonlocal total
        plan[batch] = max(plan.get(batch, now), end)
        total += expected

    for r in snapshot.running:
        left = _running_left(snapshot, now, r)
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
    return plan, total


def batch_deadlines(snapshot: VerifySnapshot, now: float, params: VerifyParams) -> dict[BatchId, float]:
    """Each batch's predicted completion: no sooner than its longest known piece of work, nor than
    the pool could clear the expected work of every batch."""
    plan, total = _batch_plans(snapshot, now, params)
    pool = snapshot.pool_size or len(snapshot.workers) or 1
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


def generation_order(keys: Sequence[tuple[str, str]], stages: Sequence[RemainingTime]) -> list[int]:
    """The order in which to generate a batch's problems, given each one's (verifier kind, key) and
    the estimators of the verification stages it goes through: longest expected verification first
    (Jackson's rule for a machine followed by delivery times: the sample that needs the longest
    verification should exist earliest, so that its verification overlaps the rest of generation
    instead of trailing it). Stable: problems without history are estimated by their kind and keep
    their relative order; with no stages the order is unchanged."""
    expected = {k: sum(est.remaining(*k) for est in stages) for k in set(keys)}
    return sorted(range(len(keys)), key=lambda i: -expected[keys[i]])


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
    """Pair the best-ordered pending verifications with free workers; the rest wait.

    A gang verification (`slots` > 1) starts only with all its workers at once. When the first one
    in order does not fit, it holds the free workers (EASY backfilling): work behind it may use them
    only if it is expected to end before enough running work does for the gang to start (its shadow
    time), so no stream of small verifications can starve it. Under `distrs` with `params.preempt`,
    urgent work that finds no worker may stop deferrable work of a cheaper batch (`_preemptions`)."""
    free = [w.worker_id for w in snapshot.workers if w.free]
    if not snapshot.pending:
        return ()
    ordered = _ordered(snapshot, now, params)
    decisions: list[Decision] = []
    waits: dict[str, list[TaskId]] = {}
    pool = snapshot.pool_size or len(snapshot.workers) + sum(r.slots for r in snapshot.running)
    reserved: PendingVerification | None = None
    shadow, held = math.inf, ""
    for n, t in enumerate(ordered):
        if not free:
            reason = "no verifier worker is free" if n == 0 else _busy_reason(len(decisions), reserved)
            waits.setdefault(reason, []).extend(p.task_id for p in ordered[n:])
            break
        if t.slots > pool:
            waits.setdefault(f"needs {t.slots} workers at once; the pool has {pool}", []).append(t.task_id)
            continue
        fits = t.slots <= len(free)
        if fits and (reserved is None or now + _remaining(snapshot, t) <= shadow):
            decisions.append(Dispatch(t.task_id, free[0], tuple(free[1 : t.slots])))
            free = free[t.slots :]
            continue
        if reserved is None and not fits:
            reserved, shadow = t, _shadow_time(snapshot, now, t.slots - len(free))
            held = _held_reason(t, len(free), shadow - now)
        waits.setdefault(held, []).append(t.task_id)
    decisions.extend(Wait(tuple(ids), reason) for reason, ids in waits.items())
    if params.preempt and params.policy is DispatchPolicy.DISTRS and waits and snapshot.running:
        decisions.extend(_preemptions(snapshot, now, params, ordered, decisions))
    return tuple(decisions)


def _busy_reason(dispatched: int, reserved: PendingVerification | None) -> str:
    if reserved is not None:
        return f"free verifier workers are held for gang verification {reserved.task_id}"
    return f"the {dispatched} free verifier worker(s) went to more urgent work"


def _held_reason(reserved: PendingVerification, free: int, wait_s: float) -> str:
    return (
        f"gang verification {reserved.task_id} needs {reserved.slots} workers at once ({free} free, the rest "
        f"expected in {wait_s:.3g} s); the free ones are held for it"
    )


def _shadow_time(snapshot: VerifySnapshot, now: float, more: int) -> float:
    """When `more` workers beyond the free ones are expected to be free: the `more`-th earliest
    expected end among the running verifications (each frees its `slots` workers)."""
    ends = sorted(
        now + _running_left(snapshot, now, r) for r in snapshot.running for _ in range(max(1, r.slots))
    )
    return ends[more - 1] if len(ends) >= more else math.inf


def _running_left(snapshot: VerifySnapshot, now: float, r: RunningVerification) -> float:
    est = snapshot.estimator
    return 1.0 if est is None else est.remaining(r.kind, r.key, _coarse(now - r.started + r.elapsed_before))


def _preemptions(
    snapshot: VerifySnapshot,
    now: float,
    params: VerifyParams,
    ordered: list[PendingVerification],
    decisions: list[Decision],
) -> list[Preempt]:
    """Urgent work that got no worker may stop a running one-slot verification of another batch.

    Urgent: waiting for the first worker to free up (`w`) would make it end after everything else its
    batch is known to need, so the wait delays the batch. A victim must belong to a batch whose idle
    training group costs less, must be able to take the restart (run again from the start after the
    urgent work, it still ends by its batch's predicted completion), and the delay avoided must be
    worth more than the work thrown away (`cost_rate x w` against its elapsed seconds). Least
    elapsed first; a run on a second or later attempt is never preempted, so two batches cannot take
    a worker back and forth."""
    dispatched = {d.task_id for d in decisions if isinstance(d, Dispatch)}
    deadlines = batch_deadlines(snapshot, now, params)
    plans, _ = _batch_plans(snapshot, now, params)
    rate = {b.batch_id: b.cost_rate for b in snapshot.batches}
    wait = min(_running_left(snapshot, now, r) for r in snapshot.running)
    est, q = snapshot.estimator, params.quantile

    def need(kind: str, key: str, elapsed: float = 0.0) -> float:
        return 1.0 if est is None else est.quantile(kind, key, q, elapsed)

    victims = sorted(
        (r for r in snapshot.running if r.slots == 1 and r.attempt == 0 and r.worker_id is not None),
        key=lambda r: (-r.started, r.task_id),  # least elapsed first
    )
    out: list[Preempt] = []
    for p in ordered:
        if p.task_id in dispatched or p.slots != 1 or not victims:
            continue
        p_need, p_rate = need(p.kind, p.key, p.elapsed), rate.get(p.batch_id, 1.0)
        if now + wait + p_need <= plans.get(p.batch_id, now):
            continue  # waiting does not make it the batch's last piece: no delay to avoid
        for v in victims:
            if rate.get(v.batch_id, 1.0) >= p_rate or p_rate * wait <= now - v.started:
                continue
            if now + p_need + need(v.kind, v.key) > deadlines.get(v.batch_id, math.inf):
                continue  # its batch cannot take the restart
            assert v.worker_id is not None
            reason = (
                f"{p.task_id} would wait {wait:.3g} s and delay its batch (idle cost {p_rate:g}/s); "
                f"{v.task_id}'s batch (idle cost {rate.get(v.batch_id, 1.0):g}/s) can take a restart"
            )
            out.append(Preempt(v.task_id, v.worker_id, p.task_id, reason))
            victims.remove(v)
            break
    return out


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
    busy = sorted(now + _running_left(snapshot, now, r) for r in snapshot.running)
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

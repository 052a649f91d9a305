"""One verifier pool stage's state core: its queue, workers and runs, and every rule that acts on them.

The Ray pool (`actors.pool`) and the simulator (`rlsched.sim.rljob`) both drive this class; neither
decides anything itself. A driver feeds `handle` the events it observed, each stamped with the time
it read from its clock, and carries out the effects returned, in order:

- `Submitted` samples join the queue, kept in the dispatch policy's order (`DispatchQueue`, which
  asks `rlsched.policy.verify.decide` whenever the order depends on the clock or a gang is queued);
  after every event the free workers are offered to the policy and each decision is a `StartRun`.
- A run has a timeout (`TimeoutTable`, RollPacker's rule); past it the worker is killed
  (`StopWorker`), since nothing short of ending the process stops arbitrary in-process code. A run
  past its kind's overdue quantile tells the estimator so (a lower bound for its siblings), and again
  each time it has run twice as long.
- With heartbeats on, a busy worker is asked every `heartbeat_s` (`AskHeartbeat`) and one silent for
  `heartbeat_timeout_s` is declared lost and killed.
- A killed or dead worker's slot is STOPPING until its exit is observed (`WorkerExited`); only then
  does a fresh worker take the slot (`StartWorker`), and it gets work once it is up (`WorkerUp`).
- Outcomes are accepted for the current attempt of an unsettled task only, so a late answer from a
  superseded run never counts twice. A retryable fault is retried up to `retries` times with
  attempt + 1; a preempted run is requeued and does not use a retry. Each run's end is a `RunEnded`
  (for the driver's span), each final outcome a `Settled`, and a CPU stage's `Prepared` a `HandedOn`.
- With `scale`, the pool is resized every `interval_s` by `advise_pool`: idle workers are released
  at once, busy ones as they finish, added ones are requested (and paid for) at once.

The timers (timeouts, overdue looks, scaling) are kept in a heap; `next_wakeup` says when the next
one is due, so a driver knows when to send the next `Tick`. A driver that handles many events per
wake-up (the simulator) asks `sooner_than(armed)` after each instead: only a timer set since its
last look can move its alarm earlier. Lifecycles: `SlotState` per worker and
`VerifyState` per task (`rlsched.policy.lifecycle`), each move checked against its table.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import islice
from typing import Any

from rlsched.core.trace import Trace
from rlsched.core.verify_pool_io import (
    AskHeartbeat,
    Effect,
    Event,
    HandedOn,
    HeartbeatAnswered,
    Heartbeats,
    Note,
    PoolCounts,
    PoolParams,
    ReleaseWorker,
    RunEnded,
    RunFinished,
    Settled,
    StartRun,
    StartWorker,
    StopReason,
    StopWorker,
    Submitted,
    Tick,
    WorkerExited,
    WorkerUp,
)
from rlsched.policy.dispatch_queue import DispatchQueue
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.lifecycle import (
    SLOT_TRANSITIONS,
    VERIFY_TRANSITIONS,
    SlotState,
    VerifyState,
    slot_transition,
    verify_transition,
)
from rlsched.policy.retry import RetryPolicy
from rlsched.policy.timeouts import TimeoutTable
from rlsched.policy.verify import (
    BatchId,
    BatchState,
    Dispatch,
    DispatchPolicy,
    PendingVerification,
    Preempt,
    RunningVerification,
    TaskId,
    VerifySnapshot,
    WorkerId,
    WorkerSlot,
    advise_pool,
    decide,
)
from verifiers.protocol import ExecutionFault, FaultKind, Outcome, Prepared, Verdict

# -- state -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Slot:
    state: SlotState
    last_heard: float = 0.0
    asked: bool = False  # a heartbeat is outstanding

    def to(self, state: SlotState) -> None:
        if state not in SLOT_TRANSITIONS[self.state]:
            slot_transition(self.state, state)  # raises, naming the edges allowed
        self.state = state


@dataclass(slots=True)
class _Run:
    task: PendingVerification
    worker: WorkerId
    gang: tuple[WorkerId, ...]
    dispatched: float
    timeout_s: float
    timeout_key: str  # whose correct runs set its timeout: the verifier kind and the problem
    state: VerifyState = VerifyState.QUEUED
    stopping: StopReason | None = None

    def to(self, state: VerifyState) -> None:
        if state not in VERIFY_TRANSITIONS[self.state]:
            verify_transition(self.state, state)  # raises, naming the edges allowed
        self.state = state


class _Timer(StrEnum):
    TIMEOUT = "timeout"
    OVERDUE = "overdue"
    SCALE = "scale"


_Due = tuple[float, int, _Timer, "_Run | None"]  # (when, seq, what, the run it watches)


@dataclass
class _Books:
    """Per-task records that outlive one run: faults so far, and whether a worker was free for it."""

    faults: dict[TaskId, int] = field(default_factory=dict)
    free_at_arrival: dict[TaskId, bool] = field(default_factory=dict)

    def forget(self, task_id: TaskId) -> None:
        self.faults.pop(task_id, None)
        self.free_at_arrival.pop(task_id, None)


class VerifyPoolCore:
    def __init__(self, params: PoolParams, estimator: RemainingTime | None = None, at: float = 0.0) -> None:
        self.params = params
        self.retry = RetryPolicy(params.retries)  # of a retryable execution fault, per task
        self.estimator = estimator if estimator is not None else RemainingTime()
        self.timeouts = TimeoutTable(params.timeouts)
        self.queue = DispatchQueue(params.verify, self.estimator)
        self._queued = self.queue.members  # read per event: a dict's truth, not a call to __len__
        self.slots: dict[WorkerId, _Slot] = {}
        self.free: dict[WorkerId, None] = {}  # IDLE workers, in the order they became idle
        self.runs: dict[TaskId, _Run] = {}
        self.on_worker: dict[WorkerId, TaskId] = {}  # each run's worker (not its gang's held ones)
        self.batches: dict[BatchId, BatchState] = {}
        self.counts = PoolCounts()
        self.books = _Books()
        self.target = params.workers  # what scaling last asked for
        self.worker_s = 0.0  # provisioned worker-seconds, from each request on
        self._since = at
        self._started = itertools.count()
        self._seq = itertools.count()
        self._timers: list[_Due] = []
        self._soonest = math.inf  # the earliest timer set since `next_wakeup` last looked
        self._out: list[Effect] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            Submitted: self._submit,
            WorkerUp: self._worker_up,
            WorkerExited: self._worker_exited,
            RunFinished: self._run_finished,
            HeartbeatAnswered: self._heard,
            Tick: self._tick,
        }
        for _ in range(params.workers):
            self._start_worker(at)
        if params.scaling is not None:
            self._timer(at + params.scaling.interval_s, _Timer.SCALE, None)

    # -- the interface -----------------------------------------------------------------------------

    def start(self) -> list[Effect]:
        """The effects of construction (the first workers to start)."""
        out, self._out = self._out, []
        return out

    def handle(self, event: Event) -> list[Effect]:
        """Take in one event; the effects, in the order they are to be carried out."""
        self._handlers[type(event)](event)
        if self._queued and (self.free or self._may_preempt):
            self._dispatch(event.at)
        out, self._out = self._out, []
        return out

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return not self._queued and not self.runs

    @property
    def _may_preempt(self) -> bool:
        """Whether `decide` may stop a run for queued work (so it is asked even with no worker free)."""
        return (
            self.params.verify.preempt
            and self.params.verify.policy is DispatchPolicy.DISTRS
            and bool(self.runs)
        )

    @property
    def provisioned(self) -> int:
        """Workers held: starting, idle, busy or stopping."""
        return len(self.slots)

    def sooner_than(self, armed: float) -> float | None:
        """`next_wakeup`, if it can be earlier than `armed` (the wake-up a driver already has set);
        otherwise None. Only a timer set since the last look, or a heartbeat, can move it earlier,
        so most events cost one comparison here. (A wake-up that finds its timer's run ended is a
        `Tick` that does nothing; the driver then asks `next_wakeup` for the next.)"""
        if self._soonest >= armed and self.params.heartbeats is None:
            return None
        return self.next_wakeup()

    def next_wakeup(self) -> float | None:
        """When the next `Tick` has something to do (a timer, a heartbeat), if anything is due."""
        self._soonest = math.inf
        timers = self._timers
        while timers:  # drop the timers of runs that have ended (inline: this runs per event)
            run = timers[0][3]
            if run is None or run.state is VerifyState.RUNNING:
                break
            heapq.heappop(timers)
        due = timers[0][0] if timers else None
        beats = self.params.heartbeats
        if beats is not None:
            for run in self._watched():
                slot = self.slots[run.worker]
                at = slot.last_heard + (beats.timeout_s if slot.asked else beats.every_s)
                due = at if due is None else min(due, at)
        return due

    def close(self, at: float) -> None:
        """Count worker-seconds up to `at` (the end of the run)."""
        self._account(at)

    # -- workers -----------------------------------------------------------------------------------

    def _start_worker(self, at: float) -> None:
        worker = WorkerId(f"{self.params.name}-{next(self._started)}")
        self._account(at)
        self.slots[worker] = _Slot(SlotState.STARTING, at)
        self._out.append(StartWorker(worker))

    def _account(self, at: float) -> None:
        """Worker-seconds up to `at` at the current size (called before the size changes)."""
        self.worker_s += self.provisioned * (at - self._since)
        self._since = at

    def _remove(self, worker: WorkerId, at: float) -> None:
        self._account(at)
        self.slots.pop(worker).to(SlotState.GONE)
        self.free.pop(worker, None)

    def _worker_up(self, event: WorkerUp) -> None:
        slot = self.slots.get(event.worker)
        if slot is None or slot.state is not SlotState.STARTING:
            return  # released or replaced meanwhile
        slot.to(SlotState.IDLE)
        slot.last_heard = event.at
        self._idle(event.worker, event.at)

    def _idle(self, worker: WorkerId, at: float) -> None:
        """An idle worker: kept (offered to the policy) or, over the scaling target, released."""
        if self.target < len(self.slots) and self.params.scaling is not None:
            self._remove(worker, at)
            self._out.append(ReleaseWorker(worker))
            return
        self.free[worker] = None

    def _worker_exited(self, event: WorkerExited) -> None:
        slot = self.slots.get(event.worker)
        if slot is None:
            return  # already replaced
        run = self._run_on(event.worker)
        if slot.state is SlotState.STARTING:
            self._out.append(Note(f"{event.worker} did not start ({event.error}); starting another"))
        self._replace(event.worker, event.at)
        if run is not None:
            self._run_ended_with_worker(run, event)

    def _replace(self, worker: WorkerId, at: float) -> None:
        self._remove(worker, at)
        self._start_worker(at)
        self.counts.replaced += 1

    def _run_on(self, worker: WorkerId) -> _Run | None:
        task_id = self.on_worker.get(worker)
        return None if task_id is None else self.runs[task_id]

    def _drop(self, run: _Run) -> None:
        del self.runs[run.task.task_id]
        del self.on_worker[run.worker]

    def _stop(self, run: _Run, reason: StopReason) -> None:
        slot = self.slots[run.worker]
        if slot.state is not SlotState.BUSY:
            return
        slot.to(SlotState.STOPPING)
        run.to(VerifyState.STOPPING)
        run.stopping = reason
        self._out.append(StopWorker(run.worker, reason))

    def _release_gang(self, run: _Run, at: float) -> None:
        for held in run.gang:
            self.slots[held].to(SlotState.IDLE)
            self._idle(held, at)

    # -- work --------------------------------------------------------------------------------------

    def _submit(self, event: Submitted) -> None:
        free, queue, books = len(self.free), self.queue, self.books.free_at_arrival
        if len(event.tasks) == 1 and free and not self._queued and event.tasks[0].slots == 1:
            # one task, nothing queued, a worker free: what the policy would pick at once (the queue
            # would hold it alone, and a free worker means nothing is preempted)
            task = event.tasks[0]
            books[task.task_id] = True
            self._run(task, next(iter(self.free)), (), event.at)
            return
        for task in event.tasks:
            queue.push(task)
            books[task.task_id] = len(queue) <= free

    def _running(self) -> tuple[RunningVerification, ...]:
        return tuple(
            RunningVerification(
                r.task.task_id,
                r.task.batch_id,
                r.dispatched,
                r.task.kind,
                r.task.key,
                r.task.elapsed,
                slots=r.task.slots,
                worker_id=r.worker,
                attempt=r.task.attempt,
            )
            for r in self.runs.values()
            if r.stopping is None
        )

    def _snapshot(self, slots: tuple[WorkerSlot, ...], pool_size: int | None) -> VerifySnapshot:
        return VerifySnapshot(
            self.queue.tasks(),
            slots,
            running=self._running(),
            batches=tuple(self.batches.values()),
            estimator=self.estimator,
            pool_size=pool_size,
        )

    def _dispatch(self, at: float) -> None:
        """Offer the free workers to the policy: from `decide` when the order depends on the clock
        or a gang is queued, otherwise from the queue that keeps `decide`'s order incrementally."""
        queue = self.queue
        if queue.needs_decide or self._may_preempt:
            for task, workers in self._decisions(at):
                self._run(task, workers[0], workers[1:], at)
            return
        for worker in list(islice(self.free, len(queue))):
            next_task = queue.pop()
            assert next_task is not None  # no more workers were taken than tasks are queued
            self._run(next_task, worker, (), at)

    def _decisions(self, at: float) -> list[tuple[PendingVerification, tuple[WorkerId, ...]]]:
        """`decide`'s pairs of (verification, workers), shown no more free workers than the queue
        could take; the preemptions it asks for are carried out."""
        gangs = self.queue.gangs
        shown = sum(t.slots for t in self.queue.tasks()) if gangs else len(self.queue)
        slots = tuple(WorkerSlot(w) for w in islice(self.free, shown))
        pairs = []
        for d in decide(self._snapshot(slots, self.provisioned), at, self.params.verify):
            if isinstance(d, Dispatch):
                task = self.queue.discard(d.task_id)
                assert task is not None
                pairs.append((task, (d.worker_id, *d.gang)))
            elif isinstance(d, Preempt):
                self._out.append(Note(f"preempt {d.task_id} on {d.worker_id} for {d.for_task}: {d.reason}"))
                self._stop(self.runs[d.task_id], StopReason.PREEMPTED)
        return pairs

    def _run(
        self, task: PendingVerification, worker: WorkerId, gang: tuple[WorkerId, ...], at: float
    ) -> None:
        for held in (worker, *gang) if gang else (worker,):
            del self.free[held]
            slot = self.slots[held]
            slot.to(SlotState.BUSY)
            slot.last_heard, slot.asked = at, False
        key = f"{task.kind}/{task.key}"
        limit = self.timeouts.limit
        # a retry runs to the limit: an adaptive stop below it may have cut a correct but slow run
        timeout = self.timeouts.timeout(key) if task.attempt == 0 else limit
        run = self.runs[task.task_id] = _Run(task, worker, gang, at, timeout, key)
        self.on_worker[worker] = task.task_id
        run.to(VerifyState.RUNNING)
        self._out.append(StartRun(task, worker, gang, timeout, limit))
        due = at + timeout + self.params.grace_s
        heapq.heappush(self._timers, (due, next(self._seq), _Timer.TIMEOUT, run))
        if due < self._soonest:
            self._soonest = due
        if task.key and self.params.learn:  # look again once it has run what its kind usually takes
            self._timer(at + max(self.estimator.overdue_after(task.kind), 1e-6), _Timer.OVERDUE, run)

    # -- results -----------------------------------------------------------------------------------

    def _run_finished(self, event: RunFinished) -> None:
        run = self.runs.get(event.task_id)
        if run is None or run.task.attempt != event.attempt:
            return  # idempotent: a superseded attempt, or a settled task
        self._drop(run)
        slot = self.slots[run.worker]
        if slot.state is SlotState.STOPPING:  # it answered just before the kill
            self._replace(run.worker, event.at)
        else:
            slot.to(SlotState.IDLE)
            self._idle(run.worker, event.at)
        if run.gang:
            self._release_gang(run, event.at)
        outcome, task = event.outcome, run.task
        if isinstance(outcome, (Verdict, Prepared)):  # a tuple: cheaper than a union, per run
            took = event.w_end - event.w_start if event.w_end > event.w_start else 0.0
            if self.params.learn:
                self.estimator.observe(task.kind, task.key, took, run_id=task.task_id)
                self.queue.observed(task.kind, task.key)
            if isinstance(outcome, Prepared) or outcome.correct:
                self.timeouts.correct_run(run.timeout_key, took)
        if isinstance(outcome, Prepared):
            self._ended(run, event.at, event.w_start, "Prepared")
            run.to(VerifyState.HANDED_ON)
            self.books.forget(task.task_id)
            self._out.append(HandedOn(replace(task, arrival=event.at, attempt=0, elapsed=0.0), outcome))
            return
        self._settle(run, outcome, event.at, event.w_start)

    def _run_ended_with_worker(self, run: _Run, event: WorkerExited) -> None:
        """The run's worker is gone: a preempted run is requeued; otherwise the run failed."""
        task, now = run.task, event.at
        elapsed = now - run.dispatched
        self._drop(run)
        self._release_gang(run, now)
        if self.params.learn:
            self.estimator.observe(task.kind, task.key, elapsed, censored=True, run_id=task.task_id)
            self.queue.observed(task.kind, task.key)
        if run.stopping is StopReason.PREEMPTED:
            self.counts.preempted += 1
            self._ended(run, now, now, "Preempted")
            self._requeue(run)
            return
        kind, detail = self._failure(run, event, elapsed)
        self._settle(run, ExecutionFault(task.task_id, kind, detail, task.attempt), now, now)

    def _failure(self, run: _Run, event: WorkerExited, elapsed: float) -> tuple[FaultKind, str]:
        """What a run whose worker ended failed of, and counted as such."""
        match run.stopping:
            case StopReason.TIMEOUT:
                self.counts.timeouts += 1
                return FaultKind.TIMEOUT, (
                    f"stopped after {elapsed:.3g} s, past its {run.timeout_s:.3g} s timeout (worker killed)"
                )
            case StopReason.LOST:
                self.counts.lost += 1
                return (
                    FaultKind.CRASH,
                    f"worker {run.worker} stopped answering heartbeats (killed after {elapsed:.3g} s)",
                )
            case _:
                self.counts.died += 1
                self._out.append(Note(f"{run.worker} died verifying {run.task.task_id}: {event.error}"))
                return FaultKind.CRASH, f"worker {run.worker} died mid-verification ({event.error})"

    def _requeue(self, run: _Run) -> None:
        """Back in the queue with attempt + 1, to run again from the start."""
        run.to(VerifyState.QUEUED)
        self.counts.requeued += 1
        self.queue.push(replace(run.task, attempt=run.task.attempt + 1))

    def _settle(self, run: _Run, outcome: Outcome, at: float, w_start: float) -> None:
        """Keep the outcome, or retry a fault that may pass (preemptions do not use up retries)."""
        task = run.task
        self._ended(run, at, w_start, type(outcome).__name__)
        faults = self.books.faults.get(task.task_id, 0)
        retryable = isinstance(outcome, ExecutionFault) and outcome.kind.retryable
        if retryable and not self.retry.gives_up(faults + 1):
            self.books.faults[task.task_id] = faults + 1
            self._requeue(run)
            return
        run.to(VerifyState.SETTLED)
        self.books.forget(task.task_id)
        self._out.append(Settled(task.task_id, outcome))

    def _ended(self, run: _Run, at: float, w_start: float, outcome: str) -> None:
        free = self.books.free_at_arrival.get(run.task.task_id, False)
        self._out.append(RunEnded(run.task, run.worker, run.gang, run.dispatched, at, w_start, outcome, free))

    # -- time --------------------------------------------------------------------------------------

    def _timer(self, at: float, what: _Timer, run: _Run | None) -> None:
        heapq.heappush(self._timers, (at, next(self._seq), what, run))
        self._soonest = min(self._soonest, at)

    @staticmethod
    def _stale(due: _Due) -> bool:
        """A run's timer can never fire once the run has ended or is being stopped."""
        run = due[3]
        return run is not None and run.state is not VerifyState.RUNNING

    def _tick(self, event: Tick) -> None:
        if event.batches is not None:
            self.batches = {b.batch_id: b for b in event.batches}
        now = event.at
        while self._timers and self._timers[0][0] <= now:
            due = heapq.heappop(self._timers)
            if not self._stale(due):
                self._fire(due, now)
        if self.params.heartbeats is not None:
            self._heartbeats(now, self.params.heartbeats)

    def _fire(self, due: _Due, now: float) -> None:
        _, _, what, run = due
        if run is None:
            self._rescale(now)
            return
        task_id = run.task.task_id
        elapsed = now - run.dispatched
        if what is _Timer.TIMEOUT:
            self._out.append(
                Note(
                    f"verification {task_id} (attempt {run.task.attempt}) passed its {run.timeout_s:.3g} s "
                    f"timeout on {run.worker}: killing the worker"
                )
            )
            self._stop(run, StopReason.TIMEOUT)
            return
        # overdue: a provisional lower bound for the task's siblings; look again at twice as long
        self.estimator.running_for(run.task.kind, run.task.key, task_id, elapsed)
        self.queue.observed(run.task.kind, run.task.key)
        self._timer(now + max(elapsed, 1e-6), _Timer.OVERDUE, run)

    def _watched(self) -> list[_Run]:
        """Runs whose worker is busy (a gang's held workers are watched through its run)."""
        return [r for r in self.runs.values() if self.slots[r.worker].state is SlotState.BUSY]

    def _heartbeats(self, now: float, beats: Heartbeats) -> None:
        for run in self._watched():
            slot = self.slots[run.worker]
            silent = now - slot.last_heard
            if silent >= beats.timeout_s:
                self._out.append(
                    Note(f"verifier worker {run.worker} has not answered for {silent:.1f} s: lost")
                )
                self._stop(run, StopReason.LOST)
            elif not slot.asked and silent >= beats.every_s:
                slot.asked = True
                self._out.append(AskHeartbeat(run.worker))

    def _heard(self, event: HeartbeatAnswered) -> None:
        slot = self.slots.get(event.worker)
        if slot is not None:
            slot.asked, slot.last_heard = False, event.at

    # -- scaling (distrs with `scaling`) ------------------------------------------------------------

    def _rescale(self, now: float) -> None:
        scaling = self.params.scaling
        assert scaling is not None
        if not self.batches:
            return  # no batch is open: nothing to size for, and no further ticks
        advice = advise_pool(
            self._snapshot((), None), now, self.params.verify, scaling.max_workers, scaling.worker_cost
        )
        self.target = advice.workers
        self._out.append(Note(f"{self.params.name} pool -> {advice.workers}: {advice.reason}"))
        while self.provisioned > self.target and self.free:  # release idle workers now
            worker, _ = self.free.popitem()
            self._remove(worker, now)
            self._out.append(ReleaseWorker(worker))
        for _ in range(self.target - self.provisioned):
            self._start_worker(now)  # paid for from the request, start-up included
        self._timer(now + scaling.interval_s, _Timer.SCALE, None)


PoolTrace = Trace[VerifyPoolCore, Event, Effect]  # what `actors.pool.VerifierPool.record` keeps

"""The Ray verifier pool of one job: workers, dispatch by the shared policy, and watching over runs.

Each sample becomes a `PendingVerification` the moment it exists (`submit`). `dispatch` asks
`rlsched.policy.verify.decide`, the call the simulator makes, and sends each decision to its worker.
`watch`, on every turn of the controller's loop, looks after the running work:

- timeouts: a run past its problem's adaptive timeout (`rlsched.policy.timeouts.TimeoutTable`,
  RollPacker's rule, capped) is stopped by killing its worker: nothing short of ending the process
  stops arbitrary in-process code;
- heartbeats: every `heartbeat_s` each busy worker is asked what it is doing; one silent for
  `heartbeat_timeout_s` is declared lost and killed;
- a run past its kind's 90th percentile tells the estimator so (a lower bound for its siblings).

A gang verification (its verifier's `slots` > 1) runs on one worker while the policy's other chosen
workers are held idle for it, all taken and released together. Under `distrs` with `preempt`, a
`Preempt` decision stops a run like a timeout does, and the run is requeued to start again later.

A slot follows `rlsched.policy.lifecycle.SlotState`: a stopped worker is STOPPING until its failed call
is observed (its process has ended), and only then does a fresh actor take the slot; the fresh one
gets work once it has answered a first call. The interrupted verification is requeued with
attempt + 1 and its elapsed time recorded as a censored observation; a timeout is reported as a
TIMEOUT fault (retried like any execution fault, up to the job's `verify_retries`). Outcomes are
idempotent by sample id and attempt: only the current attempt of a sample that has no outcome yet
is accepted, so a late answer from a superseded run can never count twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.verifier import Heartbeat, Stage, VerifierWorker
from rlsched.config import VerifierConfig
from rlsched.errors import UserError
from rlsched.metrics.spans import Span, SpanKind
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.lifecycle import SlotState, slot_transition
from rlsched.policy.timeouts import TimeoutTable
from rlsched.policy.verify import (
    BatchState,
    Dispatch,
    PendingVerification,
    Preempt,
    RunningVerification,
    TaskId,
    VerifyParams,
    VerifySnapshot,
    WorkerId,
    WorkerSlot,
    decide,
)
from verifiers.protocol import ExecutionFault, FaultKind, Outcome, Prepared, Verdict, VerifyRequest

# what a CPU stage hands to the GPU stage: the task, its request, verifier kind, iteration, payload
OnPrepared = Callable[[PendingVerification, VerifyRequest, "str | None", int, Prepared], None]


def _exited(pid: int) -> bool:
    """No such process, or only its zombie (it has exited; its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def _timeout_key(task: PendingVerification) -> str:
    return f"{task.kind}/{task.key}"


def _await_exit(pid: int, limit_s: float = 10.0) -> None:
    """Wait until `pid` has exited (after SIGKILL: at once), polling every millisecond."""
    give_up = time.monotonic() + limit_s
    while not _exited(pid) and time.monotonic() < give_up:
        time.sleep(0.001)


@dataclass
class _Run:
    task: PendingVerification
    worker: WorkerId
    dispatched: float
    iteration: int
    timeout_s: float
    stopping: str | None = None  # why the worker is being killed: "timeout", "lost" or "preempted"
    gang: tuple[WorkerId, ...] = ()  # the other workers a gang verification holds


@dataclass
class _Slot:
    handle: Any
    state: SlotState
    pid: int | None = None  # from its first heartbeat, when it runs on the controller's node
    beat: Any = None  # the outstanding heartbeat call, if any
    last_heard: float = 0.0

    def to(self, state: SlotState) -> None:
        self.state = slot_transition(self.state, state)

    def kill_here(self) -> None:
        """SIGKILL its process when it runs on the controller's node (a no-op elsewhere, or if gone)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


@dataclass
class PoolCounts:
    timeouts: int = 0  # runs stopped at their timeout
    lost: int = 0  # workers declared lost for want of a heartbeat
    died: int = 0  # workers whose process ended on its own mid-verification
    replaced: int = 0  # fresh workers started in a stopped or dead one's place
    requeued: int = 0  # verifications put back in the queue after their worker ended
    preempted: int = 0  # runs stopped for more urgent work (requeued, rerun from the start)


class VerifierPool:
    def __init__(
        self,
        cfg: VerifierConfig,
        retries: int,
        estimator: RemainingTime,
        spans: list[Span],
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = print,
        stage: Stage = "whole",
        on_prepared: OnPrepared | None = None,
        pg: Any = None,
    ) -> None:
        self.cfg, self.retries, self.estimator, self.spans = cfg, retries, estimator, spans
        self.pg = pg  # the cluster scheduler's placement group its workers start in (None: anywhere)
        self.clock, self.log = clock, log
        if stage == "cpu" and on_prepared is None:
            raise ValueError("a CPU-stage pool needs on_prepared: where its prepared work goes next")
        self.stage, self.on_prepared = stage, on_prepared
        size = cfg.gpu_workers if stage == "gpu" else cfg.workers
        if stage == "gpu" and (have := ray.cluster_resources().get("GPU", 0.0)) < size:
            raise UserError(
                f"verifier.gpu_workers is {size} but the Ray cluster has {have:g} GPU(s); each GPU worker "
                "holds one device of its own. Lower verifier.gpu_workers or add GPU nodes"
            )
        self.timeouts = TimeoutTable(cfg.timeout.params())
        self.slots: dict[WorkerId, _Slot] = {}
        self.starting: dict[Any, WorkerId] = {}  # a fresh worker's first heartbeat -> the worker
        self._node = ray.get_runtime_context().get_node_id()
        self._started = 0
        for _ in range(size):
            self._start_worker()
        self.pending: dict[TaskId, PendingVerification] = {}
        self.requests: dict[TaskId, tuple[VerifyRequest, str | None, int]] = {}  # request, kind, iteration
        self.payloads: dict[TaskId, bytes] = {}  # the GPU stage's input, from the CPU stage
        self.runs: dict[Any, _Run] = {}  # by the verify call's ObjectRef
        self.outcomes: dict[TaskId, Outcome] = {}
        self.counts = PoolCounts()
        self._free_at_arrival: dict[TaskId, bool] = {}
        self._faults: dict[TaskId, int] = {}  # execution faults so far, per sample

    # -- workers -----------------------------------------------------------------------------------

    def _start_worker(self) -> WorkerId:
        """A fresh actor, STARTING until it answers its first heartbeat (its pid and node)."""
        gpu = self.stage == "gpu"
        wid = WorkerId(f"{'gpu-' if gpu else ''}verifier-{self._started}")
        self._started += 1
        options: dict[str, Any] = (
            {"num_cpus": 1, "num_gpus": 1} if gpu else {"num_cpus": self.cfg.cpus_per_worker}
        )
        if self.pg is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.pg)
        handle = VerifierWorker.options(**options).remote(
            wid, self.cfg.kind, self.cfg.delay_s, self.cfg.sandbox.policy()
        )
        self.slots[wid] = _Slot(handle, SlotState.STARTING)
        self.starting[handle.heartbeat.remote()] = wid
        return wid

    def _stop(self, run: _Run, why: str) -> None:
        """Kill the run's worker; the slot is refilled when its failed call is observed. Ray's kill
        waits for a graceful exit first (about 5 s for a frozen process), so on this node the pool
        also sends SIGKILL itself."""
        slot = self.slots[run.worker]
        if slot.state is not SlotState.BUSY:
            return
        slot.to(SlotState.STOPPING)
        run.stopping = why
        ray.kill(slot.handle, no_restart=True)
        slot.kill_here()

    def _replace(self, wid: WorkerId) -> None:
        """The old worker's exit was observed (on this node: its pid is gone); a fresh one starts."""
        slot = self.slots.pop(wid)
        if slot.pid is not None:  # Ray counts it dead: make sure of it on this node
            slot.kill_here()
            _await_exit(slot.pid)
        slot.to(SlotState.GONE)
        self._start_worker()
        self.counts.replaced += 1

    def wait_started(self, timeout_s: float = 120.0) -> None:
        """Block until every STARTING worker has answered (benchmarks and tests start the clock
        after this; the controller just dispatches to workers as they come up)."""
        give_up = self.clock() + timeout_s
        while self.starting:
            if self.clock() > give_up:
                raise TimeoutError(
                    f"{len(self.starting)} verifier worker(s) did not start in {timeout_s:g} s"
                )
            refs = list(self.starting)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
            for ref in ready:
                self.on_ready(ref)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return not self.pending and not self.runs

    def waitables(self) -> list[Any]:
        return [*self.runs, *self.starting]

    def owns(self, ref: Any) -> bool:
        return ref in self.runs or ref in self.starting

    # -- work --------------------------------------------------------------------------------------

    def submit(
        self,
        task: PendingVerification,
        request: VerifyRequest,
        kind: str | None,
        iteration: int,
        payload: bytes = b"",
    ) -> None:
        self.pending[task.task_id] = task
        self.requests[task.task_id] = (request, kind, iteration)
        if payload:
            self.payloads[task.task_id] = payload
        free = sum(s.state is SlotState.IDLE for s in self.slots.values())
        self._free_at_arrival[task.task_id] = len(self.pending) <= free

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

    def dispatch(self, batches: tuple[BatchState, ...]) -> None:
        if not self.pending:
            return
        snapshot = VerifySnapshot(
            tuple(self.pending.values()),
            tuple(WorkerSlot(w) for w, s in self.slots.items() if s.state is SlotState.IDLE),
            running=self._running(),
            batches=batches,
            estimator=self.estimator,
            pool_size=len(self.slots),
        )
        params = VerifyParams(self.cfg.dispatch, preempt=self.cfg.preempt)
        by_task = {r.task.task_id: r for r in self.runs.values()}
        for decision in decide(snapshot, self.clock(), params):
            if isinstance(decision, Dispatch):
                self._send(self.pending.pop(decision.task_id), decision.worker_id, decision.gang)
            elif isinstance(decision, Preempt):
                self.log(f"preempting {decision.task_id} on {decision.worker_id}: {decision.reason}")
                self._stop(by_task[decision.task_id], "preempted")

    def _send(self, task: PendingVerification, wid: WorkerId, gang: tuple[WorkerId, ...] = ()) -> None:
        """Start the verification on `wid`; a gang's other workers are held, idle, until it ends
        (their cores are the gang's to use: the pool runs nothing else on them)."""
        request, kind, iteration = self.requests[task.task_id]
        for held in (wid, *gang):
            slot = self.slots[held]
            slot.to(SlotState.BUSY)
            slot.last_heard = self.clock()
        ref = self.slots[wid].handle.verify.remote(
            replace(request, attempt=task.attempt), kind, self.stage, self.payloads.get(task.task_id, b"")
        )
        timeout = self.timeouts.timeout(_timeout_key(task))
        self.runs[ref] = _Run(task, wid, self.clock(), iteration, timeout, gang=gang)

    def _release_gang(self, run: _Run) -> None:
        for held in run.gang:
            self.slots[held].to(SlotState.IDLE)

    # -- watching ----------------------------------------------------------------------------------

    def watch(self) -> None:
        now = self.clock()
        for run in list(self.runs.values()):
            elapsed = now - run.dispatched
            if run.stopping is None and elapsed > run.timeout_s:
                self.log(
                    f"verification {run.task.task_id} (attempt {run.task.attempt}) passed its "
                    f"{run.timeout_s:.3g} s timeout on {run.worker}: killing the worker"
                )
                self._stop(run, "timeout")
            elif elapsed > self.estimator.overdue_after(run.task.kind):
                self.estimator.running_for(run.task.kind, run.task.key, run.task.task_id, elapsed)
        self._heartbeats(now)

    def _heartbeats(self, now: float) -> None:
        answered = [s for s in self.slots.values() if s.beat is not None]
        if answered:
            ready, _ = ray.wait([s.beat for s in answered], num_returns=len(answered), timeout=0)
            done = set(ready)
            for slot in answered:
                if slot.beat in done:
                    slot.beat, slot.last_heard = None, now
        by_worker = {r.worker: r for r in self.runs.values()}
        for wid, slot in self.slots.items():
            if slot.state is not SlotState.BUSY or wid not in by_worker:
                continue  # idle, or held for a gang (the gang's running worker is watched)
            if now - slot.last_heard > self.cfg.heartbeat_timeout_s:
                self.log(f"verifier worker {wid} has not answered for {now - slot.last_heard:.1f} s: lost")
                self._stop(by_worker[wid], "lost")
            elif slot.beat is None and now - slot.last_heard >= self.cfg.heartbeat_s:
                slot.beat = slot.handle.heartbeat.remote()

    # -- results -----------------------------------------------------------------------------------

    def on_ready(self, ref: Any) -> None:
        if ref in self.starting:
            wid = self.starting.pop(ref)
            try:
                beat: Heartbeat = ray.get(ref)
            except ray.exceptions.RayError as err:  # it never started: try another
                self.log(f"verifier worker {wid} did not start ({err}); starting another")
                self._replace(wid)
                return
            slot = self.slots[wid]
            slot.to(SlotState.IDLE)
            slot.last_heard = self.clock()
            slot.pid = beat.pid if beat.node_id == self._node else None
            return
        self._on_outcome(self.runs.pop(ref), ref)

    def _on_outcome(self, run: _Run, ref: Any) -> None:
        now = self.clock()
        task = run.task
        try:
            outcome, w_start, w_end = ray.get(ref)
        except ray.exceptions.RayActorError as err:  # the worker's process has ended: observed now
            self._on_worker_ended(run, now, err)
            return
        except ray.exceptions.RayError as err:  # the call failed, the worker lives on
            outcome, w_start, w_end = (
                ExecutionFault(task.task_id, FaultKind.CRASH, repr(err), task.attempt),
                now,
                now,
            )
        slot = self.slots[run.worker]
        if slot.state is SlotState.STOPPING:  # it answered just before the kill landed
            self._replace(run.worker)
        else:
            slot.to(SlotState.IDLE)
        self._release_gang(run)
        if isinstance(outcome, Verdict | Prepared):
            self.estimator.observe(task.kind, task.key, max(0.0, w_end - w_start), run_id=task.task_id)
            if isinstance(outcome, Prepared) or outcome.correct:
                self.timeouts.correct_run(_timeout_key(task), max(0.0, w_end - w_start))
        if isinstance(outcome, Prepared):
            self._hand_on(run, outcome, now, w_start)
            return
        self._settle(run, outcome, now, w_start)

    def _hand_on(self, run: _Run, prepared: Prepared, now: float, w_start: float) -> None:
        """A two-stage verifier's CPU stage is done: its GPU stage takes it from here."""
        self._span(run, now, w_start, "Prepared")
        request, kind, iteration = self.requests.pop(run.task.task_id)
        self._free_at_arrival.pop(run.task.task_id, None)
        self._faults.pop(run.task.task_id, None)
        assert self.on_prepared is not None  # only a CPU-stage pool asks for Prepared, and it has one
        gpu_task = replace(run.task, arrival=now, attempt=0, elapsed=0.0)
        self.on_prepared(gpu_task, request, kind, iteration, prepared)

    def _on_worker_ended(self, run: _Run, now: float, err: Exception) -> None:
        task, elapsed = run.task, now - run.dispatched
        self._replace(run.worker)
        self._release_gang(run)
        self.estimator.observe(task.kind, task.key, elapsed, censored=True, run_id=task.task_id)
        match run.stopping:
            case "preempted":
                self.counts.preempted += 1
                self._span(run, now, now, "Preempted")
                self._requeue(task)
                return
            case "timeout":
                self.counts.timeouts += 1
                kind = FaultKind.TIMEOUT
                detail = (
                    f"stopped after {elapsed:.3g} s, past its {run.timeout_s:.3g} s timeout (worker killed)"
                )
            case "lost":
                self.counts.lost += 1
                kind = FaultKind.CRASH
                detail = f"worker {run.worker} stopped answering heartbeats (killed after {elapsed:.3g} s)"
            case _:
                self.counts.died += 1
                self.log(f"verifier worker {run.worker} died verifying {task.task_id}: {type(err).__name__}")
                kind = FaultKind.CRASH
                detail = f"worker {run.worker} died mid-verification ({type(err).__name__})"
        self._settle(run, ExecutionFault(task.task_id, kind, detail, task.attempt), now, now)

    def _requeue(self, task: PendingVerification) -> None:
        """Back in the queue with attempt + 1, to run again from the start (a verification cannot
        resume; what the stopped run showed is in the estimator as a censored observation)."""
        self.counts.requeued += 1
        again = replace(task, attempt=task.attempt + 1)
        self.pending[again.task_id] = again

    def _settle(self, run: _Run, outcome: Outcome, now: float, w_start: float) -> None:
        """Record the span; keep the outcome if it is the sample's first, retry a fault that may pass."""
        task = run.task
        self._span(run, now, w_start, type(outcome).__name__)
        if task.task_id in self.outcomes:
            return  # idempotent: the sample was settled by another attempt
        faults = self._faults.get(task.task_id, 0)
        if isinstance(outcome, ExecutionFault) and outcome.kind.retryable and faults < self.retries:
            self._faults[task.task_id] = faults + 1  # preemptions do not use up retries
            self._requeue(task)
            return
        self.outcomes[task.task_id] = outcome

    def _span(self, run: _Run, now: float, w_start: float, outcome: str) -> None:
        task = run.task
        self.spans.append(
            Span(
                SpanKind.VERIFY,
                f"{task.task_id}/gpu" if self.stage == "gpu" else task.task_id,
                run.dispatched,
                now,
                run.iteration,
                {
                    "lane": run.worker,
                    "attempt": task.attempt,
                    "queued_s": round(run.dispatched - task.arrival, 6),
                    "start_delay_s": round(w_start - task.arrival, 6),
                    "outcome": outcome,
                    "gang": list(run.gang),
                    "free_at_arrival": self._free_at_arrival.get(task.task_id, False),
                },
            )
        )

    def drain(self, batches: tuple[BatchState, ...] = (), timeout_s: float = 600.0) -> dict[TaskId, Outcome]:
        """Run what was submitted to the end (for callers with nothing else to wait on: benchmarks,
        tests); the settled outcomes. The controller runs the same `step`s in its own loop, beside
        the generation streams."""
        give_up = self.clock() + timeout_s
        while not self.idle:
            if self.clock() > give_up:
                raise TimeoutError(f"the verifier pool did not finish within {timeout_s:g} s")
            self.dispatch(batches)
            step([self], timeout_s=0.2)
        return self.take_outcomes()

    def take_outcomes(self) -> dict[TaskId, Outcome]:
        """The settled outcomes so far, handed over once (the pool forgets them)."""
        out, self.outcomes = self.outcomes, {}
        for task_id in out:
            self.requests.pop(task_id, None)
            self.payloads.pop(task_id, None)
            self._free_at_arrival.pop(task_id, None)
            self._faults.pop(task_id, None)
        return out

    def shutdown(self) -> None:
        for slot in self.slots.values():
            ray.kill(slot.handle)
        self.slots.clear()


def step(
    pools: Sequence[VerifierPool],
    others: Iterable[Any] = (),
    on_other: Callable[[Any], None] | None = None,
    timeout_s: float = 0.5,
) -> None:
    """One turn of a loop that waits on verifier pools (and on `others`, e.g. generation streams):
    block until something is done or `timeout_s` passes, let each pool watch its runs, then hand
    every finished call to its pool, and each finished one of `others` to `on_other`, in the order
    Ray returns them."""
    refs = [*others, *(ref for pool in pools for ref in pool.waitables())]
    if not refs:
        return
    ray.wait(refs, num_returns=1, timeout=timeout_s)
    for pool in pools:
        pool.watch()  # timeouts, heartbeats, overdue runs
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    for ref in ready:
        owner = next((pool for pool in pools if pool.owns(ref)), None)
        if owner is not None:
            owner.on_ready(ref)
        elif on_other is not None:
            on_other(ref)

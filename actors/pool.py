"""The Ray verifier pool of one job: a driver of `rlsched.core.verify_pool.VerifyPoolCore`.

Every rule (dispatch order, timeouts, heartbeats, retries, preemption, gangs, the slot and task
lifecycles) lives in the core, which the simulator drives too. This module only translates: a Ray
call that completes becomes a core event stamped with the controller's clock, and each effect the
core returns becomes a Ray call.

- `StartWorker` starts a `VerifierWorker` actor (in the job's placement group, if any); its first
  heartbeat's answer is `WorkerUp` (its pid, when it runs on the controller's node).
- `StartRun` calls `verify`; the answer is `RunFinished`. `RayActorError` means the process ended:
  `WorkerExited`, sent once the pid is gone on this node. Any other `RayError` is a CRASH fault of
  the run, the worker living on.
- `StopWorker` is `ray.kill`, plus SIGKILL on this node (Ray's kill waits about 5 s for a frozen
  process to exit gracefully).
- `AskHeartbeat` calls `heartbeat`; its answer is `HeartbeatAnswered`.
- `RunEnded` is a VERIFY span, `Settled` an outcome to hand over, `HandedOn` the CPU stage's
  prepared work for the GPU stage, `Note` a log line.

With `trace` on, every event fed to the core is kept with the effects it returned: the record that
`rlsched.sim.replay` replays in virtual time, decision for decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.demand import actor_options
from actors.verifier import Heartbeat, VerifierWorker, WorkerProcess
from actors.waits import step
from rlsched.config_params import pool_params, worker_bundle
from rlsched.config_verifier import VerifierConfig
from rlsched.core import verify_pool_io as vx
from rlsched.core.verify_pool import PoolTrace, VerifyPoolCore
from rlsched.errors import UserError
from rlsched.job.ports import OnPrepared, Queued
from rlsched.metrics.spans import Span, SpanKind
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import BatchState, PendingVerification, TaskId, WorkerId
from verifiers.protocol import (
    UNIT_REWARDS,
    ExecutionFault,
    FaultKind,
    Outcome,
    RewardRange,
    Stage,
    VerifyRequest,
)


class _For(StrEnum):
    """What an outstanding Ray call is for."""

    UP = "up"  # a started worker's first answer
    RUN = "run"  # a verification
    BEAT = "beat"  # a heartbeat


@dataclass(frozen=True)
class _Call:
    what: _For
    worker: WorkerId
    task_id: str = ""
    attempt: int = 0


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
        rewards: RewardRange = UNIT_REWARDS,
    ) -> None:
        self.rewards = rewards  # the task's reward range, which each worker holds its verdicts to
        if stage == "cpu" and on_prepared is None:
            raise ValueError("a CPU-stage pool needs on_prepared: where its prepared work goes next")
        params = pool_params(cfg, retries, gpu=stage == "gpu")
        if stage == "gpu" and (have := ray.cluster_resources().get("GPU", 0.0)) < params.workers:
            raise UserError(
                f"verifier.gpu_workers is {params.workers} but the Ray cluster has {have:g} GPU(s); each GPU "
                "worker holds one device of its own. Lower verifier.gpu_workers or add GPU nodes"
            )
        self.cfg, self.spans, self.clock, self.log = cfg, spans, clock, log
        self.stage, self.on_prepared = stage, on_prepared
        self.pg = pg  # the cluster scheduler's placement group its workers start in (None: anywhere)
        self.core = VerifyPoolCore(params, estimator, at=clock())
        self.estimator = estimator
        self.workers: dict[WorkerId, WorkerProcess] = {}
        self.calls: dict[Any, _Call] = {}  # by ObjectRef
        self.requests: dict[TaskId, tuple[VerifyRequest, str | None, int]] = {}  # request, kind, iteration
        self.payloads: dict[TaskId, bytes] = {}  # the GPU stage's input, from the CPU stage
        self.outcomes: dict[TaskId, Outcome] = {}
        self.trace: PoolTrace | None = None
        self._node = ray.get_runtime_context().get_node_id()
        self._apply(self.core.start())

    @property
    def counts(self) -> vx.PoolCounts:
        return self.core.counts

    def record(self) -> PoolTrace:
        """From now on, keep every event fed to the core and the effects it returned."""
        self.trace = PoolTrace.begin(self.core)
        return self.trace

    # -- events in ---------------------------------------------------------------------------------

    def _feed(self, event: vx.Event) -> None:
        effects = self.core.handle(event)
        if self.trace is not None:
            self.trace.add(event, effects)
        self._apply(effects)

    def submit(
        self,
        task: PendingVerification,
        request: VerifyRequest,
        kind: str | None,
        iteration: int,
        payload: bytes = b"",
    ) -> None:
        self.submit_many([(task, request, kind, iteration, payload)])

    def submit_many(self, items: Sequence[Queued]) -> None:
        """Queue several samples at once (they are then offered to free workers together)."""
        for task, request, kind, iteration, payload in items:
            self.requests[task.task_id] = (request, kind, iteration)
            if payload:
                self.payloads[task.task_id] = payload
        self._feed(vx.Submitted(self.clock(), tuple(item[0] for item in items)))

    def dispatch(self, batches: tuple[BatchState, ...]) -> None:
        """What the batches still wait for, as of now (the dispatch policy reads it)."""
        self._feed(vx.Tick(self.clock(), batches))

    def watch(self) -> None:
        """Let due timers fire: timeouts, heartbeats, overdue runs."""
        self._feed(vx.Tick(self.clock()))

    def on_ready(self, ref: Any) -> None:
        call = self.calls.pop(ref)
        worker = self.workers.get(call.worker)
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayActorError as err:  # the process has ended: observed now
            if call.what is _For.RUN and worker is not None:
                self._ended(call.worker)
                self._feed(vx.WorkerExited(self.clock(), call.worker, type(err).__name__))
            elif call.what is _For.UP:
                self.workers.pop(call.worker, None)
                self._feed(vx.WorkerExited(self.clock(), call.worker, str(err)))
            return  # a heartbeat's failure: the run's own call reports the death
        except ray.exceptions.RayError as err:  # the call failed, the worker lives on
            if call.what is _For.UP:
                self.workers.pop(call.worker, None)
                self._feed(vx.WorkerExited(self.clock(), call.worker, str(err)))
            elif call.what is _For.RUN:
                now = self.clock()
                fault = ExecutionFault(call.task_id, FaultKind.CRASH, repr(err), call.attempt)
                self._feed(vx.RunFinished(now, TaskId(call.task_id), call.attempt, fault, now, now))
            return
        if call.what is _For.UP:
            beat: Heartbeat = answer
            if worker is not None:
                worker.pid = beat.pid if beat.node_id == self._node else None
            self._feed(vx.WorkerUp(self.clock(), call.worker))
        elif call.what is _For.RUN:
            outcome, w_start, w_end = answer
            if worker is not None and worker.stopped:  # it answered just before the kill landed
                self._ended(call.worker)
            self._feed(
                vx.RunFinished(self.clock(), TaskId(call.task_id), call.attempt, outcome, w_start, w_end)
            )
        else:
            self._feed(vx.HeartbeatAnswered(self.clock(), call.worker))

    def _ended(self, wid: WorkerId) -> None:
        """The worker's process is gone (made sure of on this node) before the core refills its slot."""
        self.workers.pop(wid).end()

    # -- effects out -------------------------------------------------------------------------------

    def _apply(self, effects: list[vx.Effect]) -> None:
        for effect in effects:
            match effect:
                case vx.StartWorker():
                    self._start_worker(effect.worker)
                case vx.StartRun():
                    self._start_run(effect)
                case vx.StopWorker():
                    worker = self.workers[effect.worker]
                    worker.stopped = True
                    ray.kill(worker.handle, no_restart=True)
                    worker.kill_here()
                case vx.ReleaseWorker():
                    ray.kill(self.workers.pop(effect.worker).handle)
                case vx.AskHeartbeat():
                    ref = self.workers[effect.worker].handle.heartbeat.remote()
                    self.calls[ref] = _Call(_For.BEAT, effect.worker)
                case vx.RunEnded():
                    self._span(effect)
                case vx.Settled():
                    self.outcomes[effect.task_id] = effect.outcome
                case vx.HandedOn():
                    self._hand_on(effect)
                case vx.Note():
                    self.log(effect.message)

    def _start_worker(self, wid: WorkerId) -> None:
        """A fresh actor; the core holds it STARTING until it answers its first heartbeat."""
        options = actor_options(worker_bundle(self.cfg, gpu=self.stage == "gpu"))
        if self.pg is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.pg)
        handle = VerifierWorker.options(**options).remote(
            wid,
            self.cfg.kind,
            self.cfg.delay_s,
            self.cfg.sandbox.policy(),
            self.rewards,
            self.cfg.timeout.params(),
        )
        self.workers[wid] = WorkerProcess(handle)
        self.calls[handle.heartbeat.remote()] = _Call(_For.UP, wid)

    def _start_run(self, effect: vx.StartRun) -> None:
        task = effect.task
        request, kind, _ = self.requests[task.task_id]
        payload = self.payloads.get(task.task_id, b"")
        timed = replace(request, attempt=task.attempt, timeout_s=effect.timeout_s, limit_s=effect.limit_s)
        ref = self.workers[effect.worker].handle.verify.remote(timed, kind, self.stage, payload)
        self.calls[ref] = _Call(_For.RUN, effect.worker, task.task_id, task.attempt)

    def _hand_on(self, effect: vx.HandedOn) -> None:
        """A two-stage verifier's CPU stage is done: its GPU stage takes it from here."""
        request, kind, iteration = self.requests.pop(effect.task.task_id)
        assert self.on_prepared is not None  # only a CPU-stage pool asks for Prepared, and it has one
        self.on_prepared(effect.task, request, kind, iteration, effect.prepared)

    def _span(self, ended: vx.RunEnded) -> None:
        task = ended.task
        _, _, iteration = self.requests[task.task_id]
        self.spans.append(
            Span(
                SpanKind.VERIFY,
                f"{task.task_id}/gpu" if self.stage == "gpu" else task.task_id,
                ended.dispatched,
                ended.at,
                iteration,
                {
                    "lane": ended.worker,
                    "attempt": task.attempt,
                    "queued_s": round(ended.dispatched - task.arrival, 6),
                    "start_delay_s": round(ended.w_start - task.arrival, 6),
                    "outcome": ended.outcome,
                    "gang": list(ended.gang),
                    "free_at_arrival": ended.free_at_arrival,
                },
            )
        )

    # -- waiting -----------------------------------------------------------------------------------

    def wait_started(self, timeout_s: float = 120.0) -> None:
        """Block until every starting worker has answered (benchmarks and tests start the clock
        after this; the controller just dispatches to workers as they come up)."""
        give_up = self.clock() + timeout_s
        while starting := [ref for ref, call in self.calls.items() if call.what is _For.UP]:
            if self.clock() > give_up:
                raise TimeoutError(f"{len(starting)} verifier worker(s) did not start in {timeout_s:g} s")
            ready, _ = ray.wait(starting, num_returns=len(starting), timeout=1.0)
            for ref in ready:
                self.on_ready(ref)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return self.core.idle

    def waitables(self) -> list[Any]:
        return list(self.calls)

    def owns(self, ref: Any) -> bool:
        return ref in self.calls

    def wait_s(self, limit_s: float) -> float:
        """How long the caller may block before the core's next timer is due (at most `limit_s`)."""
        due = self.core.next_wakeup()
        return limit_s if due is None else max(0.0, min(limit_s, due - self.clock()))

    def drain(self, batches: tuple[BatchState, ...] = (), timeout_s: float = 600.0) -> dict[TaskId, Outcome]:
        """Run what was submitted to the end (for callers with nothing else to wait on: benchmarks,
        tests); the settled outcomes. The controller runs the same `step`s in its own loop, beside
        the generation streams."""
        give_up = self.clock() + timeout_s
        self.dispatch(batches)
        while not self.idle:
            if self.clock() > give_up:
                raise TimeoutError(f"the verifier pool did not finish within {timeout_s:g} s")
            step([self], timeout_s=0.2)
        return self.take_outcomes()

    def take_outcomes(self) -> dict[TaskId, Outcome]:
        """The settled outcomes so far, handed over once (the pool forgets them)."""
        out, self.outcomes = self.outcomes, {}
        for task_id in out:
            self.requests.pop(task_id, None)
            self.payloads.pop(task_id, None)
        return out

    def shutdown(self) -> None:
        for worker in self.workers.values():
            ray.kill(worker.handle)
        self.workers.clear()

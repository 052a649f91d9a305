"""RL jobs in virtual time: generate on instances, verify on a shared pool, update, publish; repeat.

A scenario (`rlsched.sim.scenario.ScenarioConfig`) holds one or more jobs and one verifier pool they share.
Each iteration of a job asks for `samples` generations spread over `instances` rollout instances of
`slots` concurrent sequences each; a sample's generation time is drawn (`generate_s`, or
`tokens / tokens_per_s`). Each finished sample becomes a pending verification of the pool's CPU
stage; if the job has a GPU stage it then queues for a GPU worker, which runs one verification at a
time (an exclusive device). Every dispatch is decided by `rlsched.policy.verify.decide`, the function
the Ray controller calls, over the pending work of every job. When a job's batch is judged, its update
and publish take their drawn durations and the next iteration starts. With `overlap` off a job hands
its samples to the pool only once all of them exist (the sequential baseline).

Each pool stage learns verification times per problem (`rlsched.policy.estimate.RemainingTime`, fed
by every completion) and keeps its queue in the policy's order (`rlsched.policy.dispatch_queue`,
equal to `decide`'s by a property test; `decide` itself is asked whenever the order depends on the
clock). Under `distrs` with `pool.autoscale`, `advise_pool` resizes the pool every
`scale_interval_s`: idle workers are released at once, busy ones as they finish, new ones take
`start_s` to start; worker-seconds are counted from the request. Spans use the runtime's schema
(with a `job` attribute), so `phase_times` and the Chrome trace serve both.

Departures, on purpose and for now: generation speed does not depend on how many slots are busy;
the policy is shown only as many free workers as the pending tasks could take (exact for one-slot
verifications).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice

import numpy as np

from rlsched.metrics.spans import Span, SpanKind, phase_times
from rlsched.policy.dispatch_queue import DispatchQueue
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.queueing import fcfs
from rlsched.policy.verify import (
    BatchId,
    BatchState,
    Dispatch,
    DispatchPolicy,
    PendingVerification,
    Preempt,
    RunningVerification,
    TaskId,
    VerifyParams,
    VerifySnapshot,
    WorkerId,
    WorkerSlot,
    advise_pool,
    decide,
    generation_order,
)
from rlsched.sim.dists import draw
from rlsched.sim.engine import Simulator
from rlsched.sim.fleet import SimFleet
from rlsched.sim.scenario import ScenarioConfig, SimJobConfig, SimPoolConfig

Done = Callable[[TaskId, float, WorkerId], None]  # (task, start, worker), called at the end


@dataclass
class SimRun:
    spans: list[Span] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    events: int = 0
    busy_s: dict[str, float] = field(default_factory=dict)  # verification seconds per pool stage
    worker_s: dict[str, float] = field(default_factory=dict)  # provisioned worker-seconds per stage
    instances: dict[str, dict[str, float]] = field(default_factory=dict)  # elastic jobs: each one's life
    resumed: int = 0  # reclaimed samples that resumed from saved tokens
    restarted: int = 0  # and those that started over

    def of_job(self, job: str) -> list[Span]:
        return [s for s in self.spans if s.attrs.get("job") == job]

    def t_iter(self, iteration: int, job: str | None = None) -> float:
        spans = self.spans if job is None else self.of_job(job)
        return phase_times([s for s in spans if s.iteration == iteration]).t_iter


class _Stage:
    """One kind of verifier worker (CPU or GPU), shared by every job: its queue, its workers, what
    it has learnt about verification times, and (with autoscaling) how many workers it holds."""

    def __init__(
        self, name: str, workers: int, sim: Simulator, policy: DispatchPolicy, pool: SimPoolConfig
    ) -> None:
        self.name, self.sim, self.pool = name, sim, pool
        self.params = VerifyParams(policy, preempt=pool.preempt)
        self.max_workers = workers
        # free workers in the order they became free (a dict: ordered, O(1) removal); the policy is
        # shown free slots only, so a decision costs O(free + pending), not O(all workers)
        self.free: dict[WorkerId, None] = {WorkerId(f"{name}-{k}"): None for k in range(workers)}
        self.spare: list[WorkerId] = []  # released by scaling, ready to be started again
        self.estimator = RemainingTime()
        self.pending = DispatchQueue(self.params, self.estimator)  # in the policy's order
        self.running: dict[TaskId, tuple[PendingVerification, float]] = {}  # and when it started
        self.held: dict[TaskId, tuple[WorkerId, ...]] = {}  # the workers each running one holds
        self.preempted = 0
        self.work: dict[TaskId, tuple[float, Done]] = {}
        self.jobs: list[_Job] = []
        self.learns = policy is not DispatchPolicy.FIFO or pool.autoscale  # fifo needs no estimates
        self.busy_s = 0.0
        self.provisioned = workers
        self._target = workers  # what advise_pool last asked for
        self.worker_s = 0.0
        self._since = 0.0  # when `provisioned` last changed

    @property
    def autoscale(self) -> bool:
        return self.pool.autoscale and self.params.policy is DispatchPolicy.DISTRS

    def submit(self, task: PendingVerification, duration: float, done: Done) -> None:
        """Queue a verification; the caller calls `dispatch` once it has submitted what it has."""
        self.pending.push(task)
        self.work[task.task_id] = (duration, done)

    def _snapshot(self, slots: tuple[WorkerSlot, ...], pool_size: int | None) -> VerifySnapshot:
        """What `decide` and `advise_pool` see: the queue, running work, the jobs' batches."""
        return VerifySnapshot(
            self.pending.tasks(),
            slots,
            running=self._running(),
            batches=tuple(j.batch_state() for j in self.jobs if j.active),
            estimator=self.estimator,
            pool_size=pool_size,
        )

    def _running(self) -> tuple[RunningVerification, ...]:
        return tuple(
            RunningVerification(
                t.task_id,
                t.batch_id,
                start,
                t.kind,
                t.key,
                slots=t.slots,
                worker_id=self.held[t.task_id][0],
                attempt=t.attempt,
            )
            for t, start in self.running.values()
        )

    def _decisions(self) -> list[tuple[PendingVerification, tuple[WorkerId, ...]]]:
        """The policy's pairs of (verification, free workers): from `decide` when the order depends
        on the clock or a gang is queued, otherwise from the queue that keeps `decide`'s order
        incrementally. Preemptions `decide` asks for are carried out here."""
        if self.pending.needs_decide:
            pairs = []
            # no more free slots than pending tasks could take (all of them when gangs are queued)
            shown = sum(t.slots for t in self.pending.tasks()) if self.pending.gangs else len(self.pending)
            slots = tuple(WorkerSlot(w) for w in islice(self.free, shown))
            for d in decide(self._snapshot(slots, self.provisioned), self.sim.now, self.params):
                if isinstance(d, Dispatch):
                    task = self.pending.discard(d.task_id)
                    assert task is not None
                    pairs.append((task, (d.worker_id, *d.gang)))
                elif isinstance(d, Preempt):
                    self._preempt(d)
            return pairs
        workers = list(islice(self.free, len(self.pending)))
        return [(task, (w,)) for w in workers if (task := self.pending.pop()) is not None]

    def dispatch(self) -> None:
        if not len(self.pending) or not self.free:
            return
        preempted = self.preempted
        for task, workers in self._decisions():
            for worker in workers:
                del self.free[worker]
            self.running[task.task_id] = (task, self.sim.now)
            self.held[task.task_id] = workers
            self.sim.record(f"dispatch {task.task_id} -> {', '.join(workers)}")
            duration, _ = self.work[task.task_id]
            self.sim.after(duration, partial(self._finish, workers[0], task.task_id, self.sim.now))
            if self.learns and task.key:  # look again once it has run what its kind usually takes
                after = max(self.estimator.overdue_after(task.kind), 1e-6)
                self.sim.after(after, partial(self._overdue, task, self.sim.now))
        if self.preempted > preempted:
            self.dispatch()  # the preempted runs' workers are free now

    def _preempt(self, d: Preempt) -> None:
        """Stop a run (in virtual time the kill and the exit are immediate); it reruns from the start."""
        task, start = self.running.pop(d.task_id)
        self.preempted += 1
        self.sim.record(f"preempt {d.task_id} on {d.worker_id} for {d.for_task}: {d.reason}")
        for worker in self.held.pop(d.task_id):
            self.free[worker] = None
        if self.learns:
            self.estimator.observe(
                task.kind, task.key, self.sim.now - start, censored=True, run_id=task.task_id
            )
            self.pending.observed(task.kind, task.key)
        self.pending.push(replace(task, attempt=task.attempt + 1))

    def _overdue(self, task: PendingVerification, start: float) -> None:
        """Still running past what its kind usually takes: tell the estimator (a provisional lower
        bound for the task's siblings), re-key them, and look again when it has run twice as long."""
        running = self.running.get(task.task_id)
        if running is None or running[1] != start:
            return  # finished, or this is a later attempt
        elapsed = self.sim.now - start
        self.estimator.running_for(task.kind, task.key, task.task_id, elapsed)
        self.pending.observed(task.kind, task.key)
        self.sim.after(elapsed, partial(self._overdue, task, start))

    def _finish(self, worker: WorkerId, task: TaskId, start: float) -> None:
        running = self.running.get(task)
        if running is None or running[1] != start:
            return  # this run was preempted (its rerun, if any, has its own finish)
        pending, _ = self.running.pop(task)
        duration, done = self.work.pop(task)
        self.busy_s += duration * pending.slots
        if self.learns:
            self.estimator.observe(pending.kind, pending.key, duration, run_id=task)
            self.pending.observed(pending.kind, pending.key)
        for held in self.held.pop(task):
            if self.autoscale and self.provisioned > self._target:
                self._resize(self.provisioned - 1)  # over target: this worker goes back as it frees
                self.spare.append(held)
            else:
                self.free[held] = None
        done(task, start, worker)
        self.dispatch()

    # -- pool size over time (distrs with `pool.autoscale`) -----------------------------------------

    def _resize(self, provisioned: int) -> None:
        self.worker_s += self.provisioned * (self.sim.now - self._since)
        self.provisioned, self._since = provisioned, self.sim.now

    def start_scaling(self) -> None:
        self._target = self.max_workers
        self.sim.after(self.pool.scale_interval_s, self.rescale)

    def rescale(self) -> None:
        if not any(j.active for j in self.jobs):
            return  # every job is done: no further ticks
        advice = advise_pool(
            self._snapshot((), None), self.sim.now, self.params, self.max_workers, self.pool.worker_cost
        )
        self._target = advice.workers
        self.sim.record(f"{self.name} pool -> {advice.workers}: {advice.reason}")
        while self.provisioned > self._target and self.free:  # release idle workers now
            worker, _ = self.free.popitem()
            self.spare.append(worker)
            self._resize(self.provisioned - 1)
        if self.provisioned < self._target:
            adding = self._target - self.provisioned
            self._resize(self._target)  # paid for from the request, start-up included
            for _ in range(adding):
                self.sim.after(self.pool.start_s, self._started)
        self.sim.after(self.pool.scale_interval_s, self.rescale)

    def _started(self) -> None:
        self.free[self.spare.pop()] = None
        self.dispatch()

    def close(self, end: float) -> None:
        """Count worker-seconds up to `end`, when the last job finished (later events are checks
        that found nothing to do)."""
        self.worker_s += self.provisioned * (end - self._since)


class _Job:
    """One job's state between events; every method is an event handler or a phase."""

    def __init__(self, cfg: SimJobConfig, sim: Simulator, run: SimRun, cpu: _Stage, gpu: _Stage | None):
        self.cfg, self.sim, self.run, self.cpu, self.gpu = cfg, sim, run, cpu, gpu
        self.name = cfg.name
        self.cpu_s: np.ndarray = np.zeros(0)
        self.gpu_s: np.ndarray = np.zeros(0)
        self.tokens: np.ndarray = np.zeros(0)
        self.problem_of: list[int] = []  # sample n of this iteration -> its problem
        self.base: dict[int, tuple[float, float]] = {}  # a problem's CPU and GPU verify seconds
        self.order = np.zeros(0, dtype=np.int64)  # the dataset's problems in this epoch's order
        self.next_problem = 0
        self.held: list[tuple[PendingVerification, int]] = []  # sequential baseline: the batch so far
        self.iteration = 0
        self.generating = 0
        self.unjudged = 0
        self.t_start = 0.0
        self.last_generation_s: float | None = None  # how long the previous iteration generated
        self.active = True
        self.fleet = (
            SimFleet(cfg, sim, self.on_sample, self._pulled, sim.record) if cfg.weights is not None else None
        )

    def batch_state(self) -> BatchState:
        end = None if self.last_generation_s is None else self.t_start + self.last_generation_s
        return BatchState(
            BatchId(f"{self.name}/iter-{self.iteration}"),
            cost_rate=float(self.cfg.trainer_gpus),
            outstanding=self.generating,
            generation_end=end,
            kind=self.name,
        )

    def _span(self, kind: SpanKind, span_id: str, start: float, lane: str) -> None:
        """A span of the current iteration ending now."""
        attrs = {"lane": lane, "job": self.name}
        self.run.spans.append(Span(kind, span_id, start, self.sim.now, self.iteration, attrs))

    def _generation_times(self, n: int) -> np.ndarray:
        c, rng = self.cfg, self.sim.rng
        if c.generate_s is not None:
            return draw(c.generate_s, rng, n)
        assert c.tokens is not None and c.tokens_per_s is not None  # the config guarantees one model
        self.tokens = np.round(draw(c.tokens, rng, n))
        seconds: np.ndarray = self.tokens / np.maximum(draw(c.tokens_per_s, rng, n), 1e-12)
        return seconds

    def _problems(self, count: int) -> list[int]:
        """This iteration's problems: new ones each time, or the dataset's in epochs."""
        if self.cfg.problems is None:
            first = self.next_problem
            self.next_problem += count
            return list(range(first, first + count))
        out = []
        for _ in range(count):
            if self.next_problem % self.cfg.problems == 0:
                self.order = self.sim.rng.permutation(self.cfg.problems)
            out.append(int(self.order[self.next_problem % self.cfg.problems]))
            self.next_problem += 1
        return out

    def _ordered(self, problems: list[int]) -> list[int]:
        """Under `distrs` with `pool.order_generation`, the problems with the longest expected
        verification are generated first (`generation_order`); otherwise as drawn."""
        stage = self.cpu
        if not (stage.pool.order_generation and stage.params.policy is DispatchPolicy.DISTRS):
            return problems
        if self.cfg.problems is None:
            return problems  # new problems every iteration: no history tells them apart
        stages = [s.estimator for s in (self.cpu, self.gpu) if s is not None]
        order = generation_order([(self.name, f"p{p}") for p in problems], stages)
        return [problems[i] for i in order]

    def _verify_times(self, problems: list[int]) -> None:
        """Each sample's CPU (and GPU) seconds: its problem's, times a lognormal spread."""
        c, rng = self.cfg, self.sim.rng
        new = [p for p in dict.fromkeys(problems) if p not in self.base]
        cpu = draw(c.verify_cpu_s, rng, len(new))
        gpu = draw(c.verify_gpu_s, rng, len(new)) if c.verify_gpu_s is not None else np.zeros(len(new))
        self.base.update(zip(new, zip(cpu.tolist(), gpu.tolist(), strict=True), strict=True))
        self.problem_of = [p for p in problems for _ in range(c.group_size)]
        self.cpu_s = np.array([self.base[p][0] for p in self.problem_of])
        self.gpu_s = np.array([self.base[p][1] for p in self.problem_of])
        if c.verify_spread > 0:
            sigma = c.verify_spread
            self.cpu_s *= rng.lognormal(-(sigma**2) / 2, sigma, c.samples)
            self.gpu_s *= rng.lognormal(-(sigma**2) / 2, sigma, c.samples)
        if c.problems is None:
            self.base.clear()  # never seen again

    def start_iteration(self) -> None:
        c = self.cfg
        self.iteration += 1
        self.t_start = self.sim.now
        self.generating = self.unjudged = c.samples
        durations = self._generation_times(c.samples)
        self._verify_times(self._ordered(self._problems(c.samples // c.group_size)))
        if self.fleet is not None:  # one queue, READY instances take from it (rlsched.sim.fleet)
            rates = self.tokens / np.maximum(durations, 1e-12)
            self.fleet.start_iteration(self.tokens.tolist(), rates.tolist())
            return
        for inst in range(c.instances):  # sample n on instance n mod instances, `slots` at once
            members = range(inst, c.samples, c.instances)
            lanes = fcfs([0.0] * len(members), [float(durations[n]) for n in members], c.slots)
            lane = f"{self.name}/rollout-{inst}"
            for n, end in zip(members, lanes.ends, strict=True):
                self.sim.at(self.sim.now + end, partial(self.on_sample, n, lane))

    def _pending(self, task: TaskId, n: int, slots: int = 1) -> PendingVerification:
        batch = BatchId(f"{self.name}/iter-{self.iteration}")
        key = "" if self.cfg.problems is None else f"p{self.problem_of[n]}"  # new problems: no history
        return PendingVerification(task, batch, self.sim.now, kind=self.name, key=key, slots=slots)

    def _pulled(self, instance: str, start: float, join: bool) -> None:
        """An instance has a version: a join (not a phase) or the reload after an update."""
        attrs = {"lane": instance, "job": self.name, "join": join}
        self.run.spans.append(
            Span(SpanKind.TRANSFER, f"{instance}/v", start, self.sim.now, self.iteration, attrs)
        )

    def on_sample(self, n: int, lane: str) -> None:
        task = TaskId(f"{self.name}/{self.iteration}-{n}")
        self._span(SpanKind.GENERATE, task, self.t_start, lane)
        pending = self._pending(task, n, self.cfg.verify_slots)
        self.generating -= 1
        if self.generating == 0:
            self.last_generation_s = self.sim.now - self.t_start
        if self.cfg.overlap:
            self.cpu.submit(pending, float(self.cpu_s[n]), partial(self.on_cpu_done, n))
            self.cpu.dispatch()
            return
        self.held.append((pending, n))
        if self.generating == 0:
            for p, k in self.held:
                self.cpu.submit(p, float(self.cpu_s[k]), partial(self.on_cpu_done, k))
            self.held.clear()
            self.cpu.dispatch()

    def on_cpu_done(self, n: int, task: TaskId, start: float, worker: WorkerId) -> None:
        self._span(SpanKind.VERIFY, task, start, worker)
        if self.gpu is None:
            self.on_judged()
            return
        pending = self._pending(task, n)
        self.gpu.submit(pending, float(self.gpu_s[n]), self.on_gpu_done)
        self.gpu.dispatch()

    def on_gpu_done(self, task: TaskId, start: float, worker: WorkerId) -> None:
        self._span(SpanKind.VERIFY, f"{task}/gpu", start, worker)
        self.on_judged()

    def on_judged(self) -> None:
        self.unjudged -= 1
        if self.unjudged > 0:
            return
        c = self.cfg
        update = float(draw(c.update_s, self.sim.rng, 1)[0])
        if c.update_tokens_per_s is not None:
            update += float(self.tokens.sum()) / c.update_tokens_per_s
        self.sim.after(update, partial(self.on_updated, update))

    def on_updated(self, took: float) -> None:
        it, lane = self.iteration, f"{self.name}/trainer"
        self._span(SpanKind.UPDATE, f"{self.name}/update-{it}", self.sim.now - took, lane)
        publish = float(draw(self.cfg.publish_s, self.sim.rng, 1)[0])
        self.sim.after(publish, partial(self.on_published, publish))

    def on_published(self, took: float) -> None:
        it = self.iteration
        self._span(SpanKind.PUBLISH, f"{self.name}/v{it}", self.sim.now - took, f"{self.name}/trainer")
        if self.fleet is not None:  # every instance pulls the new version over the link first
            self.fleet.reload(self._iteration_done)
        else:
            self._iteration_done()

    def _iteration_done(self) -> None:
        it = self.iteration
        self._span(SpanKind.ITERATION, f"{self.name}/iter-{it}", self.t_start, f"{self.name}/controller")
        self.sim.record(f"{self.name} iteration {it} done")
        if it < self.cfg.iterations:
            self.start_iteration()
        else:
            self.active = False
            if self.fleet is not None:
                self.fleet.closed = True


def simulate(scenario: ScenarioConfig, seed: int, policy: DispatchPolicy | None = None) -> SimRun:
    """One run of every job of the scenario, under `policy` (default: the scenario's first)."""
    policy = policy or scenario.policies[0]
    sim = Simulator(seed)
    run = SimRun()
    pool = scenario.pool
    stages = {"cpu": _Stage("cpu", pool.cpu_workers, sim, policy, pool)}
    if pool.gpu_workers:
        stages["gpu"] = _Stage("gpu", pool.gpu_workers, sim, policy, pool)
    jobs = []
    for cfg in scenario.jobs:
        gpu = stages["gpu"] if cfg.verify_gpu_s is not None else None
        job = _Job(cfg, sim, run, stages["cpu"], gpu)
        jobs.append(job)
        for stage in (stages["cpu"], gpu):
            if stage is not None:
                stage.jobs.append(job)
        sim.at(0.0, job.start_iteration)
    for stage in stages.values():
        if stage.autoscale:
            stage.start_scaling()
    run.events = sim.run()
    run.decisions = sim.decisions
    end = max((s.end for s in run.spans), default=0.0)
    for job in jobs:
        if job.fleet is not None:
            run.instances.update(job.fleet.lives(end))
            run.resumed += job.fleet.resumed
            run.restarted += job.fleet.restarted
    for name, stage in stages.items():
        stage.close(end)
        run.busy_s[name] = stage.busy_s
        run.worker_s[name] = stage.worker_s
    return run

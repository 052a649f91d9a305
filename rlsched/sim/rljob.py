"""RL jobs in virtual time: generate on instances, verify on a shared pool, update, publish; repeat.

A scenario (`rlsched.sim.scenario.ScenarioConfig`) holds one or more jobs and one verifier pool they share
(`rlsched.sim.jobs.simulate` runs them together).
Each iteration of a job asks for `samples` generations from its rollout fleet (`rlsched.sim.fleet`,
a driver of the runtime's fleet core: `instances` static instances, transient ones with windows,
each READY instance holding `request_batch` requests, refilled slot by slot or batch by batch as
`refill` says, every version pulled before it is served); a sample's generation time is drawn
(`generate_s`, or `tokens / tokens_per_s`). The first version goes to every instance before
iteration 1, and each new one after its publish, as at runtime. Each finished sample becomes a
pending verification of the pool's CPU stage; if the job has a GPU stage it then queues for a GPU
worker, which runs one verification at a time (an exclusive device). Every dispatch is decided by
`rlsched.policy.verify.decide`, the function the Ray controller calls, over the pending work of
every job. When a job's batch is judged, its update and publish take their drawn durations and the
next iteration starts. With `overlap` off a job hands its samples to the pool only once all of them
exist (the sequential baseline).

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

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import cast

import numpy as np

from rlsched.core.iteration import (
    Committed,
    Dropped,
    Generate,
    Publish,
    Reload,
    Reloaded,
    Started,
    Update,
    Updated,
    Verify,
    VersionPublished,
)
from rlsched.core.iteration import Effect as IterationEffect
from rlsched.core.iteration import Event as IterationEvent
from rlsched.core.pipeline import PipelineCore, PipelineParams
from rlsched.core.verify_pool import VerifyPoolCore
from rlsched.core.verify_pool_io import (
    Effect,
    Event,
    HandedOn,
    Note,
    PoolParams,
    RunEnded,
    RunFinished,
    Scaling,
    Settled,
    StartRun,
    StartWorker,
    StopWorker,
    Submitted,
    Tick,
    WorkerExited,
    WorkerUp,
    dispatch_line,
    render,
)
from rlsched.metrics.spans import Span, SpanKind, phase_times
from rlsched.policy.verify import (
    BatchId,
    BatchState,
    DispatchPolicy,
    PendingVerification,
    TaskId,
    VerifyParams,
    WorkerId,
    generation_order,
)
from rlsched.policy.versions import PipelineMode
from rlsched.sim.dists import draw
from rlsched.sim.engine import Alarm, Simulator
from rlsched.sim.fleet import SimFleet
from rlsched.sim.scenario import SimJobConfig, SimPoolConfig
from verifiers.protocol import Outcome, Prepared, Verdict

Done = Callable[[TaskId, "Outcome | PendingVerification"], None]  # settled, or handed to the GPU stage


@dataclass(slots=True)
class StageWork:
    """What the simulator drew for one verification, and whom to tell when it is done."""

    seconds: float
    done: Done
    iteration: int
    prepares: bool = False  # a CPU stage's run whose work goes on to the GPU stage


@dataclass
class SimRun:
    spans: list[Span] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    events: int = 0
    busy_s: dict[str, float] = field(default_factory=dict)  # verification seconds per pool stage
    worker_s: dict[str, float] = field(default_factory=dict)  # provisioned worker-seconds per stage
    instances: dict[str, dict[str, float]] = field(default_factory=dict)  # elastic jobs: each one's life
    resumed: int = 0  # reclaimed samples that resumed from saved tokens
    dropped: dict[str, int] = field(default_factory=dict)  # per async job: samples left out as too stale
    staleness: dict[str, dict[int, int]] = field(default_factory=dict)  # per async job: trained, by staleness
    restarted: int = 0  # and those that started over

    def of_job(self, job: str) -> list[Span]:
        return [s for s in self.spans if s.attrs.get("job") == job]

    def t_iter(self, iteration: int, job: str | None = None) -> float:
        spans = self.spans if job is None else self.of_job(job)
        return phase_times([s for s in spans if s.iteration == iteration]).t_iter


class PoolStage:
    """One kind of verifier worker (CPU or GPU), shared by every job: a driver of the pool's core
    (`rlsched.core.verify_pool`) in virtual time. A run takes its drawn duration and ends with a
    passing verdict (or, on a CPU stage with a GPU stage after it, prepared work); a kill and the
    exit it causes are immediate; the first workers are up at once, any later one (a replacement,
    or one added by scaling) after `start_s`."""

    def __init__(
        self,
        name: str,
        workers: int,
        sim: Simulator,
        policy: DispatchPolicy,
        pool: SimPoolConfig,
        spans: list[Span],
    ) -> None:
        self.name, self.sim, self.pool, self.spans = name, sim, pool, spans
        self.params = VerifyParams(policy, preempt=pool.preempt)
        autoscale = pool.autoscale and policy is DispatchPolicy.DISTRS
        scaling = Scaling(workers, pool.scale_interval_s, pool.worker_cost) if autoscale else None
        self.core = VerifyPoolCore(
            PoolParams(
                self.params,
                workers=workers,
                retries=pool.verify_retries,
                timeouts=pool.timeout.params(),
                scaling=scaling,
                learn=policy is not DispatchPolicy.FIFO or autoscale,  # fifo reads no estimates
                name=name,
            ),
            at=sim.now,
        )
        self.estimator = self.core.estimator
        self.work: dict[TaskId, StageWork] = {}
        self.jobs: list[SimJob] = []
        self.busy_s = 0.0
        self._alarm = Alarm(sim, self._on_tick)
        for effect in self.core.start():  # the first workers are up at once
            assert isinstance(effect, StartWorker)
            self._feed(WorkerUp(sim.now, effect.worker))

    def submit(self, tasks: list[tuple[PendingVerification, StageWork]]) -> None:
        """Queue verifications, each with its drawn seconds and what to call once it is done here."""
        for task, work in tasks:
            self.work[task.task_id] = work
        self._feed(Submitted(self.sim.now, tuple([t for t, _ in tasks])))

    def submit_one(self, task: PendingVerification, work: StageWork) -> None:
        """`submit` of one verification (the common case: a sample verified as it arrives)."""
        self.work[task.task_id] = work
        self._feed(Submitted(self.sim.now, (task,)))

    def batches_changed(self) -> None:
        """What the jobs' batches wait for has changed (the dispatch policy reads it)."""
        self._feed(Tick(self.sim.now, tuple(b for j in self.jobs if j.active for b in j.batch_states())))

    def _feed(self, event: Event) -> None:
        self._apply(self.core.handle(event))
        alarm = self._alarm
        due = self.core.sooner_than(math.inf if alarm.handle is None else alarm.handle.time)
        if due is not None:
            alarm.arm(due)

    def _on_tick(self) -> None:
        self._apply(self.core.handle(Tick(self.sim.now)))
        self._alarm.arm(self.core.next_wakeup())  # the alarm has rung: look for the next in full

    def _apply(self, effects: list[Effect]) -> None:
        sim = self.sim
        for e in effects:  # the common effects first, in the order they are most frequent
            if type(e) is StartRun:  # `type is`: cheaper than isinstance, per run
                work = self.work[e.task.task_id]
                sim.at(sim.now + work.seconds, partial(self._finished, e.task, sim.now, work.prepares))
                sim.decisions.append(dispatch_line(e, sim.now))
            elif type(e) is RunEnded:
                self._ended(e)
            elif type(e) is Settled:
                self.work.pop(e.task_id).done(e.task_id, e.outcome)
            elif isinstance(e, HandedOn):
                self.work.pop(e.task.task_id).done(e.task.task_id, e.task)
            else:
                self._apply_rare(e)

    def _apply_rare(self, e: Effect) -> None:
        """Effects of timeouts, preemption and scaling: a kill and its exit are immediate; the first
        workers are up at once, any later one after `start_s`."""
        sim = self.sim
        sim.decisions.extend(render((e,), sim.now))
        if isinstance(e, StopWorker):
            sim.after(0.0, partial(self._feed, WorkerExited(sim.now, e.worker, "killed")))
        elif isinstance(e, StartWorker):
            sim.after(self.pool.start_s, partial(self._up, e.worker))
        elif isinstance(e, Note):
            sim.record(e.message)

    def _up(self, worker: WorkerId) -> None:
        self._feed(WorkerUp(self.sim.now, worker))

    def _finished(self, task: PendingVerification, start: float, prepares: bool) -> None:
        now = self.sim.now
        outcome = Prepared(task.task_id, b"") if prepares else Verdict(task.task_id, 1.0, True)
        self._feed(RunFinished(now, task.task_id, task.attempt, outcome, start, now))

    def _ended(self, e: RunEnded) -> None:
        """A run's span (every attempt, the runtime's schema with the job's name)."""
        self.busy_s += (e.at - e.dispatched) * e.task.slots
        iteration = self.work[e.task.task_id].iteration
        span_id = f"{e.task.task_id}/gpu" if self.name == "gpu" else e.task.task_id
        job = e.task.kind  # a job's verifications carry its name as their kind
        attrs = {"lane": e.worker, "job": job, "attempt": e.task.attempt, "outcome": e.outcome}
        self.spans.append(Span(SpanKind.VERIFY, span_id, e.dispatched, e.at, iteration, attrs))

    @property
    def worker_s(self) -> float:
        return self.core.worker_s

    def close(self, end: float) -> None:
        """Count worker-seconds up to `end`, when the last job finished (later events are checks
        that found nothing to do)."""
        self.core.close(end)


class SimJob:
    """One job's state between events; every method is an event handler or a phase. The one driver of
    the iteration core (`rlsched.core.pipeline`) in virtual time, for `mode: sync` (the pipeline zero
    versions ahead) and `mode: async` alike: the core decides when each wave's requests go out, when
    a sample goes to verification, which judged groups the trainer takes and which it drops as too
    stale; this class carries its effects out on the simulator's clock.

    The fleet core routes the requests (a wave's queue behind the running ones; an instance asked to
    reload in the middle of a batch finishes it on its version and pulls afterwards), the shared
    verifier pool judges each sample, and update and publish take their drawn durations. A sample's
    version is the one its instance held when the request was routed to it; a resumed sample keeps
    the older of the two. Spans carry the iteration they serve: a generated sample its wave's (from
    the wave's start), an update and a publish their step's; an iteration span runs from its wave's
    start (sync) or the commit before (async) to its own commit."""

    def __init__(self, cfg: SimJobConfig, sim: Simulator, run: SimRun, cpu: PoolStage, gpu: PoolStage | None):
        self.cfg, self.sim, self.run, self.cpu, self.gpu = cfg, sim, run, cpu, gpu
        self.name = cfg.name
        self.cpu_s: np.ndarray = np.zeros(0)
        self.gpu_s: np.ndarray = np.zeros(0)
        self.cpu_list: list[float] = []
        self.tokens: np.ndarray = np.zeros(0)
        self.problem_of: list[int] = []  # sample n of the newest wave -> its problem
        self.base: dict[int, tuple[float, float]] = {}  # a problem's CPU and GPU verify seconds
        self.order = np.zeros(0, dtype=np.int64)  # the dataset's problems in this epoch's order
        self.next_problem = 0
        self.arrivals: dict[str, tuple[int, PendingVerification]] = {}  # until the core says verify
        self.reads_batches = cpu.params.policy is DispatchPolicy.DISTRS  # the only policy that does
        self.dropped = 0  # samples left out as too stale (an async job's)
        self.staleness: dict[int, int] = {}  # samples trained, by versions stale (an async job's)
        self.async_mode = cfg.mode is PipelineMode.ASYNC
        self.active = True
        self.core = iteration_core(cfg)
        self.fleet = SimFleet(cfg, sim, self.on_sample, self._pulled, sim.record)
        self.wave_start: dict[int, float] = {}
        # sample n, numbered across waves: its wave, verify seconds and problem (arrays, which the
        # collector never walks), and its id (a wave's, from the wave's first sample number)
        self.wave_of = array("q")
        self.cpu_all = array("d")
        self.gpu_all = array("d")
        self.problem_all = array("q")
        self.wave_ids: dict[int, tuple[TaskId, ...]] = {}
        self.first_of: dict[int, int] = {}
        self.number: dict[str, int] = {}  # request id -> sample number (only to price an update's tokens)
        self._batches: dict[int, BatchId] = {}  # a wave's batch id, made once

    @property
    def iteration(self) -> int:
        return self.core.iteration

    def batch_states(self) -> tuple[BatchState, ...]:
        return self.core.batch_states()

    def _feed(self, event: IterationEvent) -> None:
        self._apply(self.core.handle(event))

    def _apply(self, effects: Sequence[IterationEffect]) -> None:
        for e in effects:
            if not self.active:  # its last iteration is committed: what is left in flight is moot
                return
            if type(e) is Verify:
                self._verify(e.request_ids)
            elif isinstance(e, Generate):
                self._start_wave(e.iteration)
            elif isinstance(e, Update):
                self._update_batch(e)
            elif isinstance(e, Dropped):
                self.dropped += len(e.request_ids)
                self.sim.record(
                    f"{self.name}: {len(e.request_ids)} sample(s) dropped, older than v{e.oldest}"
                )
            elif isinstance(e, Publish):
                publish = float(draw(self.cfg.publish_s, self.sim.rng, 1)[0])
                self.sim.after(publish, partial(self._published, e.version, publish))
            elif isinstance(e, Reload):  # every instance pulls the new version (over the link) first
                self.fleet.publish(e.version)
                self.fleet.reload(partial(self._at_now, Reloaded))
            elif isinstance(e, Committed):
                self._committed(e)

    def _at_now(self, kind: type[Reloaded]) -> None:
        self._feed(kind(self.sim.now))

    def _span(self, kind: SpanKind, span_id: str, start: float, lane: str, iteration: int) -> None:
        """A span of `iteration` ending now."""
        attrs = {"lane": lane, "job": self.name}
        self.run.spans.append(Span(kind, span_id, start, self.sim.now, iteration, attrs))

    # -- generation -----------------------------------------------------------------------------------

    def _generation_times(self, n: int) -> np.ndarray:
        c, rng = self.cfg, self.sim.rng
        if c.generate_s is not None:
            return draw(c.generate_s, rng, n)
        assert c.tokens is not None and c.tokens_per_s is not None  # the config guarantees one model
        self.tokens = np.round(draw(c.tokens, rng, n))
        seconds: np.ndarray = self.tokens / np.maximum(draw(c.tokens_per_s, rng, n), 1e-12)
        return seconds

    def _problems(self, count: int) -> list[int]:
        """A wave's problems: new ones each time, or the dataset's in epochs."""
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
        self.cpu_list = self.cpu_s.tolist()  # read per sample: floats, not numpy scalars
        if c.problems is None:
            self.base.clear()  # never seen again

    def start(self) -> None:
        """The job's first version goes to every instance before its first wave (as at runtime)."""
        self.fleet.publish(0)
        self.fleet.reload(lambda: self._apply(self.core.start()))

    def _start_wave(self, wave: int) -> None:
        c = self.cfg
        durations = self._generation_times(c.samples)
        self._verify_times(self._ordered(self._problems(c.samples // c.group_size)))
        if c.tokens is None:  # the seconds model: a sample's "tokens" are its seconds, at 1 a second
            tokens, rates = durations.tolist(), [1.0] * c.samples
        else:
            tokens, rates = self.tokens.tolist(), (self.tokens / np.maximum(durations, 1e-12)).tolist()
        first = self.fleet.start_wave(wave, tokens, rates)
        ids = cast(tuple[TaskId, ...], tuple([f"{self.name}/{wave}-{n}" for n in range(c.samples)]))
        if c.update_tokens_per_s is not None:
            self.number.update((rid, first + n) for n, rid in enumerate(ids))
        self.wave_ids[wave], self.first_of[wave] = ids, first
        self.wave_of.extend([wave] * c.samples)
        self.cpu_all.extend(self.cpu_list)
        self.gpu_all.extend(self.gpu_s.tolist())
        self.problem_all.extend(self.problem_of)
        self.wave_start[wave] = self.sim.now
        self._feed(Started(self.sim.now, wave, tuple(ids)))
        self._batch_changed()

    def _pending(self, task: TaskId, n: int, slots: int = 1) -> PendingVerification:
        key = "" if self.cfg.problems is None else f"p{self.problem_all[n]}"  # new problems: no history
        wave = self.wave_of[n]
        batch = self._batches.get(wave) or self._batches.setdefault(wave, self.core.batch_id(wave))
        return PendingVerification(task, batch, self.sim.now, kind=self.name, key=key, slots=slots)

    def _pulled(self, instance: str, start: float, join: bool) -> None:
        """An instance has a version: a join (not a phase) or the reload after an update."""
        attrs = {"lane": instance, "job": self.name, "join": join}
        self.run.spans.append(
            Span(SpanKind.TRANSFER, f"{instance}/v", start, self.sim.now, self.iteration, attrs)
        )

    def _stages(self) -> tuple[PoolStage, ...]:
        return (self.cpu,) if self.gpu is None else (self.cpu, self.gpu)

    def _batch_changed(self) -> None:
        if self.reads_batches:
            for stage in self._stages():
                stage.batches_changed()

    def on_sample(self, n: int, lane: str) -> None:
        wave = self.wave_of[n]
        task = self.wave_ids[wave][n - self.first_of[wave]]
        self._span(SpanKind.GENERATE, task, self.wave_start[wave], lane, wave)
        self.arrivals[task] = (n, self._pending(task, n, self.cfg.verify_slots))
        self._apply(self.core.sample_arrived(self.sim.now, task, self.fleet.versions[n]))  # SampleArrived
        if self.reads_batches:
            self._batch_changed()

    # -- verification ---------------------------------------------------------------------------------

    def _verify(self, tasks: tuple[str, ...]) -> None:
        """The core hands these to the pool: each with its drawn seconds, and whom to tell."""
        prepares, out = self.gpu is not None, []
        for task in tasks:
            n, pending = self.arrivals.pop(task)
            out.append(
                (pending, StageWork(self.cpu_all[n], partial(self.on_cpu_done, n), self.wave_of[n], prepares))
            )
        if len(out) == 1:
            self.cpu.submit_one(*out[0])
        else:
            self.cpu.submit(out)

    def on_cpu_done(self, n: int, task: TaskId, result: Outcome | PendingVerification) -> None:
        if self.gpu is None or not isinstance(result, PendingVerification):
            self.on_judged(task)  # judged here (or the CPU stage failed it for good)
            return
        self.gpu.submit([(result, StageWork(self.gpu_all[n], self.on_gpu_done, self.wave_of[n]))])

    def on_gpu_done(self, task: TaskId, result: Outcome | PendingVerification) -> None:
        self.on_judged(task)

    def on_judged(self, task: TaskId) -> None:
        effects = self.core.judged_now(self.sim.now, task)  # handle(Judged), per sample
        if effects:
            self._apply(effects)

    # -- training -------------------------------------------------------------------------------------

    def _update_batch(self, e: Update) -> None:
        c = self.cfg
        update = float(draw(c.update_s, self.sim.rng, 1)[0])
        if c.update_tokens_per_s is not None:
            tokens = self.fleet.tokens
            number = self.number
            update += float(np.sum([tokens[number.pop(r)] for r in e.request_ids])) / c.update_tokens_per_s
        if self.async_mode:
            for stale, count in e.staleness:
                self.staleness[stale] = self.staleness.get(stale, 0) + count
        self.sim.after(update, partial(self._updated, e.iteration, update))

    def _updated(self, step: int, took: float) -> None:
        lane = f"{self.name}/trainer"
        self._span(SpanKind.UPDATE, f"{self.name}/update-{step}", self.sim.now - took, lane, step)
        self._feed(Updated(self.sim.now))

    def _published(self, version: int, took: float) -> None:
        lane = f"{self.name}/trainer"
        self._span(SpanKind.PUBLISH, f"{self.name}/v{version}", self.sim.now - took, lane, version)
        self._feed(VersionPublished(self.sim.now, version))

    def _committed(self, e: Committed) -> None:
        it = e.iteration
        self._span(SpanKind.ITERATION, f"{self.name}/iter-{it}", e.started, f"{self.name}/controller", it)
        self.sim.record(f"{self.name} iteration {it} done")
        if it >= self.cfg.iterations:
            self.active = False
            self._batch_changed()
            self.fleet.close()


def sim_pipeline_params(cfg: SimJobConfig) -> PipelineParams:
    """A simulated job's iteration core parameters, as `rlsched.config_params.pipeline_params` makes a
    job config's: a step's groups, the buffer, the staleness bound, the mode, overlap and the cost rate."""
    return PipelineParams(
        batch_groups=cfg.samples // cfg.group_size,
        group_size=cfg.group_size,
        max_staleness=cfg.max_staleness,
        buffer_groups=cfg.buffer,
        overlap=cfg.overlap,
        cost_rate=float(cfg.trainer_gpus),
        batch_prefix=f"{cfg.name}/iter-",
        kind=cfg.name,
        mode=cfg.mode,
    )


def iteration_core(cfg: SimJobConfig, version: int = 0, at: float = 0.0, steps: int = 0) -> PipelineCore:
    """The simulator's iteration core for a job (from version `version` at time `at`, `steps` steps
    committed): `SimJob` runs one from the start."""
    return PipelineCore(sim_pipeline_params(cfg), version=version, at=at, steps=steps)

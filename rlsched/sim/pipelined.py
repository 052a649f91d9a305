"""A pipelined (`mode: async`) RL job in virtual time: the pipeline core (`rlsched.core.pipeline`)
decides when each iteration's requests go out, which judged groups the trainer takes and which it
drops as too stale; this driver carries its effects out on the simulator's clock.

Everything else is the sequential job's (`rlsched.sim.rljob`): the same fleet core routes the
requests (the next iteration's queue behind the running ones; an instance asked to reload in the
middle of a batch finishes it on its version and pulls afterwards), the same verifier pool judges
each sample, and update and publish take their drawn durations. A sample's version is the one its
instance held when the request was routed to it; a resumed sample keeps the older of the two.

Spans carry the iteration they serve: a generated sample its wave's (the span runs from the wave's
start), an update and a publish their step's; an iteration span runs from the commit before to its
own, so the steady-state t_iter is the time between commits.
"""

from __future__ import annotations

from functools import partial
from typing import cast

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
from rlsched.core.pipeline import PipelineCore, PipelineParams
from rlsched.metrics.spans import Span, SpanKind
from rlsched.policy.verify import BatchState, PendingVerification, TaskId
from rlsched.sim.dists import draw
from rlsched.sim.engine import Simulator
from rlsched.sim.rljob import PoolStage, SimJob, SimRun, StageWork
from rlsched.sim.scenario import SimJobConfig
from verifiers.protocol import Outcome


class PipelinedJob(SimJob):
    """One async job's state between events; every method is an event handler or a phase."""

    def __init__(self, cfg: SimJobConfig, sim: Simulator, run: SimRun, cpu: PoolStage, gpu: PoolStage | None):
        super().__init__(cfg, sim, run, cpu, gpu)
        self.pipe = PipelineCore(
            PipelineParams(
                batch_groups=cfg.samples // cfg.group_size,
                group_size=cfg.group_size,
                max_staleness=cfg.max_staleness,
                buffer_groups=cfg.buffer,
                overlap=cfg.overlap,
                cost_rate=float(cfg.trainer_gpus),
                batch_prefix=f"{cfg.name}/iter-",
                kind=cfg.name,
            )
        )
        self.wave_start: dict[int, float] = {}
        self.wave_of: list[int] = []  # sample n (numbered across waves) -> its wave
        self.cpu_all: list[float] = []
        self.gpu_all: list[float] = []
        self.problem_all: list[int] = []
        self.number: dict[str, int] = {}  # request id -> sample number

    @property
    def iteration(self) -> int:
        return self.pipe.iteration

    def batch_states(self) -> tuple[BatchState, ...]:
        return self.pipe.batch_states()

    def _apply(self, effects: list[IterationEffect]) -> None:
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
            elif isinstance(e, Reload):
                self.fleet.publish(e.version)
                self.fleet.reload(partial(self._pipe_feed, Reloaded))
            elif isinstance(e, Committed):
                self._committed(e)

    def _pipe_feed(self, kind: type[Reloaded]) -> None:
        self._apply(self.pipe.handle(kind(self.sim.now)))

    def _span_of(self, kind: SpanKind, span_id: str, start: float, lane: str, iteration: int) -> None:
        attrs = {"lane": lane, "job": self.name}
        self.run.spans.append(Span(kind, span_id, start, self.sim.now, iteration, attrs))

    # -- generation -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.fleet.publish(0)
        self.fleet.reload(lambda: self._apply(self.pipe.start()))

    def _start_wave(self, wave: int) -> None:
        if not self.active:
            return
        c = self.cfg
        durations = self._generation_times(c.samples)
        self._verify_times(self._ordered(self._problems(c.samples // c.group_size)))
        if c.tokens is None:
            tokens, rates = durations.tolist(), [1.0] * c.samples
        else:
            tokens, rates = self.tokens.tolist(), (self.tokens / durations.clip(min=1e-12)).tolist()
        first = self.fleet.start_wave(wave, tokens, rates)
        ids = cast(list[TaskId], [f"{self.name}/{wave}-{n}" for n in range(c.samples)])
        self.number.update((rid, first + n) for n, rid in enumerate(ids))
        self.ids += ids
        self.wave_of += [wave] * c.samples
        self.cpu_all += self.cpu_list
        self.gpu_all += self.gpu_s.tolist()
        self.problem_all += self.problem_of
        self.wave_start[wave] = self.sim.now
        self._apply(self.pipe.handle(Started(self.sim.now, wave, tuple(ids))))
        self._batch_changed()

    def _pending(self, task: TaskId, n: int, slots: int = 1) -> PendingVerification:
        key = "" if self.cfg.problems is None else f"p{self.problem_all[n]}"
        batch = self.pipe.batch_id(self.wave_of[n])
        return PendingVerification(task, batch, self.sim.now, kind=self.name, key=key, slots=slots)

    def on_sample(self, n: int, lane: str) -> None:
        task, wave = self.ids[n], self.wave_of[n]
        self._span_of(SpanKind.GENERATE, task, self.wave_start[wave], lane, wave)
        self.arrivals[task] = (n, self._pending(task, n, self.cfg.verify_slots))
        self._apply(self.pipe.sample_arrived(self.sim.now, task, self.fleet.versions[n]))
        if self.reads_batches:
            self._batch_changed()

    def _verify(self, tasks: tuple[str, ...]) -> None:
        prepares, out = self.gpu is not None, []
        for task in tasks:
            n, pending = self.arrivals.pop(task)
            work = StageWork(self.cpu_all[n], partial(self.on_cpu_done, n), self.wave_of[n], prepares)
            out.append((pending, work))
        self.cpu.submit(out)

    def on_cpu_done(self, n: int, task: TaskId, result: Outcome | PendingVerification) -> None:
        if self.gpu is None or not isinstance(result, PendingVerification):
            self.on_judged(task)
            return
        self.gpu.submit([(result, StageWork(self.gpu_all[n], self.on_gpu_done, self.wave_of[n]))])

    def on_judged(self, task: TaskId) -> None:
        effects = self.pipe.judged_now(self.sim.now, task)
        if effects:
            self._apply(effects)

    # -- training -------------------------------------------------------------------------------------

    def _update_batch(self, e: Update) -> None:
        c = self.cfg
        update = float(draw(c.update_s, self.sim.rng, 1)[0])
        if c.update_tokens_per_s is not None:
            tokens = self.fleet.tokens
            update += sum(tokens[self.number[r]] for r in e.request_ids) / c.update_tokens_per_s
        for stale, count in e.staleness:
            self.staleness[stale] = self.staleness.get(stale, 0) + count
        self.sim.after(update, partial(self._updated, e.iteration, update))

    def _updated(self, step: int, took: float) -> None:
        lane = f"{self.name}/trainer"
        self._span_of(SpanKind.UPDATE, f"{self.name}/update-{step}", self.sim.now - took, lane, step)
        self._apply(self.pipe.handle(Updated(self.sim.now)))

    def _published(self, version: int, took: float) -> None:
        lane = f"{self.name}/trainer"
        self._span_of(SpanKind.PUBLISH, f"{self.name}/v{version}", self.sim.now - took, lane, version)
        self._apply(self.pipe.handle(VersionPublished(self.sim.now, version)))

    def _committed(self, e: Committed) -> None:
        it = e.iteration
        self._span_of(SpanKind.ITERATION, f"{self.name}/iter-{it}", e.started, f"{self.name}/controller", it)
        self.sim.record(f"{self.name} iteration {it} done")
        if it >= self.cfg.iterations:
            self.active = False
            self._batch_changed()
            self.fleet.close()

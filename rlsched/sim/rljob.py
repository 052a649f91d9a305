"""An RL job in virtual time: generate on instances, verify on workers, update, publish; repeat.

The first model of the simulator, and the smallest that exercises the runtime's decisions: each
iteration asks for `samples` generations, spread over `instances` rollout instances of `slots`
concurrent sequences each; a sample's generation time is drawn from a distribution; each finished
sample is handed to `rlsched.policy.verify.decide` (the function the Ray controller calls) and
verified on one of `workers` workers for a drawn duration; when the batch is judged, the update and
the publish take their durations. Spans use the runtime's schema, so `phase_times` and the Chrome
trace serve both. With `overlap` off, verification waits for the whole batch (the sequential
baseline).

Departures, on purpose and for now: generation speed does not depend on how many slots are busy, and
the policy sees every pending task but only as many free workers as those tasks could take (exact for
one-slot verifications, O(pending) per decision).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from itertools import islice

import numpy as np

from rlsched.metrics.spans import Span, SpanKind, phase_times
from rlsched.policy.queueing import fcfs
from rlsched.policy.verify import (
    BatchId,
    Dispatch,
    DispatchPolicy,
    PendingVerification,
    TaskId,
    VerifyParams,
    VerifySnapshot,
    WorkerId,
    WorkerSlot,
    decide,
)
from rlsched.sim.engine import Simulator


class DistKind(StrEnum):
    CONSTANT = "constant"
    UNIFORM = "uniform"
    LOGNORMAL = "lognormal"
    EMPIRICAL = "empirical"  # draws from observed `values` (e.g. fitted from a runtime's spans)


@dataclass(frozen=True)
class Dist:
    """A duration distribution in seconds: constant(a), uniform(a, b), lognormal(mean a, sigma b)."""

    kind: DistKind
    a: float = 0.0
    b: float = 0.0
    values: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind is DistKind.EMPIRICAL and (not self.values or min(self.values) < 0):
            raise ValueError("an empirical distribution needs at least one non-negative value")
        if self.a < 0 or self.b < 0:
            raise ValueError(f"{self.kind} distribution parameters must be non-negative ({self.a}, {self.b})")
        if self.kind is DistKind.UNIFORM and self.b < self.a:
            raise ValueError("uniform(a, b) needs a <= b")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        match self.kind:
            case DistKind.CONSTANT:
                return np.full(n, self.a)
            case DistKind.UNIFORM:
                return rng.uniform(self.a, self.b, n)
            case DistKind.EMPIRICAL:
                return rng.choice(np.asarray(self.values, dtype=float), n)
            case DistKind.LOGNORMAL:  # parameterised by its mean, so `a` reads as seconds
                mu = np.log(self.a) - self.b**2 / 2 if self.a > 0 else -np.inf
                return rng.lognormal(mu, self.b, n) if self.a > 0 else np.zeros(n)


@dataclass(frozen=True)
class RLJobModel:
    iterations: int = 3
    samples: int = 256
    instances: int = 2
    slots: int = 64
    generate: Dist = Dist(DistKind.UNIFORM, 0.1, 0.5)
    verify: Dist = Dist(DistKind.CONSTANT, 0.01)
    workers: int = 4
    update_s: float = 0.5
    publish_s: float = 0.01
    overlap: bool = True
    dispatch: DispatchPolicy = DispatchPolicy.FIFO

    def __post_init__(self) -> None:
        for name in ("iterations", "samples", "instances", "slots", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.update_s < 0 or self.publish_s < 0:
            raise ValueError("update_s and publish_s must be non-negative")


@dataclass
class SimRun:
    spans: list[Span] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    events: int = 0

    def t_iter(self, iteration: int) -> float:
        return phase_times([s for s in self.spans if s.iteration == iteration]).t_iter


class _Job:
    """The job's state between events; every method is an event handler or a phase."""

    def __init__(self, model: RLJobModel, sim: Simulator, run: SimRun) -> None:
        self.m, self.sim, self.run = model, sim, run
        # free workers in the order they became free (a dict: ordered, O(1) removal); the policy is
        # shown free slots only, so a decision costs O(free + pending), not O(all workers)
        self.free: dict[WorkerId, None] = {WorkerId(f"verifier-{k}"): None for k in range(model.workers)}
        self.verify_s: np.ndarray = np.zeros(0)
        self.pending: dict[TaskId, PendingVerification] = {}
        self.started: dict[TaskId, float] = {}
        self.iteration = 0
        self.generating = 0
        self.unjudged = 0
        self.t_start = 0.0

    def start_iteration(self) -> None:
        self.iteration += 1
        self.t_start = self.sim.now
        self.generating = self.unjudged = self.m.samples
        durations = self.m.generate.draw(self.sim.rng, self.m.samples)
        self.verify_s = self.m.verify.draw(self.sim.rng, self.m.samples)  # sample n's verification time
        for inst in range(self.m.instances):  # sample n on instance n mod instances, `slots` at once
            members = range(inst, self.m.samples, self.m.instances)
            lanes = fcfs([0.0] * len(members), [float(durations[n]) for n in members], self.m.slots)
            for n, end in zip(members, lanes.ends, strict=True):
                self.sim.at(self.sim.now + end, partial(self.on_sample, n, inst))

    def on_sample(self, n: int, inst: int) -> None:
        task = TaskId(f"{self.iteration}-{n}")
        self.run.spans.append(
            Span(
                SpanKind.GENERATE,
                task,
                self.t_start,
                self.sim.now,
                self.iteration,
                {"lane": f"rollout-{inst}"},
            )
        )
        self.pending[task] = PendingVerification(task, BatchId(f"iter-{self.iteration}"), self.sim.now)
        self.generating -= 1
        if self.m.overlap or self.generating == 0:
            self.dispatch()

    def dispatch(self) -> None:
        if not self.pending or not self.free:
            return
        # no more free slots than pending tasks could take: exact for one-slot tasks (gang verifiers,
        # which need k slots at once, will need the snapshot to say so)
        slots = tuple(WorkerSlot(w) for w in islice(self.free, len(self.pending)))
        snapshot = VerifySnapshot(tuple(self.pending.values()), slots)
        for d in decide(snapshot, self.sim.now, VerifyParams(self.m.dispatch)):
            if isinstance(d, Dispatch):
                self.pending.pop(d.task_id)
                del self.free[d.worker_id]
                self.started[d.task_id] = self.sim.now
                self.sim.record(f"dispatch {d.task_id} -> {d.worker_id}")
                duration = float(self.verify_s[int(d.task_id.rsplit("-", 1)[1])])
                self.sim.after(duration, partial(self.on_verified, d.worker_id, d.task_id))

    def on_verified(self, worker: WorkerId, task: TaskId) -> None:
        self.free[worker] = None
        self.run.spans.append(
            Span(
                SpanKind.VERIFY, task, self.started.pop(task), self.sim.now, self.iteration, {"lane": worker}
            )
        )
        self.unjudged -= 1
        if self.unjudged == 0:
            self.sim.after(self.m.update_s, self.on_updated)
        else:
            self.dispatch()

    def _span(self, kind: SpanKind, span_id: str, start: float, lane: str) -> None:
        """A span of the current iteration ending now."""
        self.run.spans.append(Span(kind, span_id, start, self.sim.now, self.iteration, {"lane": lane}))

    def on_updated(self) -> None:
        self._span(SpanKind.UPDATE, f"update-{self.iteration}", self.sim.now - self.m.update_s, "trainer")
        self.sim.after(self.m.publish_s, self.on_published)

    def on_published(self) -> None:
        it = self.iteration
        self._span(SpanKind.PUBLISH, f"v{it}", self.sim.now - self.m.publish_s, "trainer")
        self._span(SpanKind.ITERATION, f"iter-{it}", self.t_start, "controller")
        self.sim.record(f"iteration {it} done")
        if it < self.m.iterations:
            self.start_iteration()


def simulate(model: RLJobModel, seed: int) -> SimRun:
    sim = Simulator(seed)
    run = SimRun()
    job = _Job(model, sim, run)
    sim.at(0.0, job.start_iteration)
    run.events = sim.run()
    run.decisions = sim.decisions
    return run

"""Many jobs on one cluster in virtual time: a job trace through the cluster scheduler's core
(`rlsched.core.cluster.ClusterCore`, the one the Ray scheduler actor drives), with preemption and
grace periods.

An admitted job runs for its remaining work. An evicted one keeps running through its grace period,
then ends PREEMPTED, as on the runtime: what it did since its last save (every `save_every_s`) is
counted as saved, and the rest stays undone. A job with `requeue` (what `rlsched submit` does) is
requeued by the core instead and comes back when admitted again, for the work left since its last
save. An evicted elastic part just leaves (the job carries on without it) and comes back when there
is room again (`Grow`). A cycle follows every event, and every wake-up the core asks for (a grace
period ends, a running job's minimum run time ends, a waiting job reaches its maximum wait).
Reported: the share of devices allocated over time, each class's queueing delay and completion
time, the maximum wait, preemptions, unfinished jobs, and Jain's fairness index over the queues'
dominant shares (time-weighted).

`synthetic_trace` draws a trace: Poisson arrivals per class, gang sizes, lognormal run times.
Virtual time throughout; the same seed gives the same run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from rlsched.core.cluster import ClusterCore
from rlsched.core.cluster_io import (
    Event,
    JobEnded,
    JobFinished,
    JobId,
    JobRequeued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    Tick,
)
from rlsched.policy.cluster_model import AdmissionParams, PendingJob, RunningJob, demand, dominant_share
from rlsched.policy.lifecycle import JobState
from rlsched.policy.placement import Gang, Node, add
from rlsched.sim.engine import EventHandle, Simulator


@dataclass(frozen=True)
class TraceJob:
    job: PendingJob
    work_s: float  # run time when never interrupted
    save_every_s: float = 600.0
    requeue: bool = False  # preempted, it waits again and resumes from its last save


@dataclass
class _Live:
    trace: TraceJob
    left_s: float  # work still to do
    started: float = 0.0
    running: bool = False
    submitted: float = 0.0
    first_start: float | None = None
    preempted: int = 0


@dataclass
class ClusterRun:
    allocation: float = 0.0  # time-weighted share of devices allocated, until the last arrival
    makespan: float = 0.0
    waits: dict[str, list[float]] = field(default_factory=dict)  # per class: arrival to first start
    completions: dict[str, list[float]] = field(default_factory=dict)  # per class: arrival to finish
    preemptions: int = 0
    grown: int = 0  # elastic parts given back to running jobs
    allocation_series: list[float] = field(default_factory=list)  # share allocated, per bucket_s
    jain: float = 1.0  # time-weighted Jain's index over queues' weighted dominant shares
    unfinished: int = 0
    # (when, job, its start): each reservation made or moved
    reservations: list[tuple[float, str, float]] = field(default_factory=list)
    queue_series: dict[str, list[float]] = field(default_factory=dict)  # per queue: device share per bucket
    intervals: list[Interval] = field(default_factory=list)  # every stretch a job ran, as they ended


@dataclass(frozen=True)
class Interval:
    """A stretch of one job's run: from a start to its end (done, preempted or requeued)."""

    job: str
    queue: str
    priority: str
    start: float
    end: float
    devices: float
    done: bool


class ClusterSim:
    """A driver of `rlsched.core.cluster.ClusterCore` in virtual time: arrivals from the trace, a job
    runs for its remaining work once started, and a cycle follows every event (the runtime cycles
    every `cycle_s`; here cycles are instantaneous) and every wake-up the core asks for."""

    def __init__(
        self,
        nodes: Sequence[Node],
        params: AdmissionParams,
        trace: Sequence[TraceJob],
        devices: Sequence[str],
        bucket_s: float = 3600.0,
    ) -> None:
        self.sim = Simulator(0)
        self.bucket_s = bucket_s
        self._buckets: list[float] = []  # device-share x seconds, per bucket
        self._queue_buckets: dict[str, list[float]] = {q: [] for q in params.queues}
        # allocation is measured while jobs arrive (to the last arrival), not over the drain after it
        self.horizon_s = max((t.job.submitted for t in trace), default=0.0)
        self.nodes, self.params, self.devices = tuple(nodes), params, tuple(devices)
        self.capacity = add(*(n.capacity for n in self.nodes))
        self.core = ClusterCore(params)
        self.jobs = {t.job.name: _Live(t, t.work_s, submitted=t.job.submitted) for t in trace}
        self.run = ClusterRun()
        self._last = 0.0
        self._alloc_s = 0.0
        self._jain_s = 0.0
        self._woken: EventHandle | None = None  # the next wake-up cycle
        self._inventory: tuple[Node, ...] | None = self.nodes  # given with the first cycle
        for t in trace:
            self.sim.at(t.job.submitted, partial(self._arrive, t.job.name))

    # -- accounting -------------------------------------------------------------------------------
    def _running(self) -> list[RunningJob]:
        return self.core.running()

    def _advance(self) -> None:
        dt = self.sim.now - self._last
        if dt > 0:
            running = self._running()
            used = add(*(r.usage() for r in running))
            total = sum(self.capacity.get(d, 0.0) for d in self.devices)
            share = sum(used.get(d, 0.0) for d in self.devices) / total if total else 0.0
            self._alloc_s += (
                max(0.0, min(self.sim.now, self.horizon_s) - min(self._last, self.horizon_s)) * share
            )
            _spread(self._buckets, self.bucket_s, self._last, self.sim.now, share)
            shares = []
            for q, qp in self.params.queues.items():
                usage = add(*(r.usage() for r in running if r.queue == q))
                shares.append(dominant_share(usage, self.capacity, qp.weight))
                mine = sum(usage.get(d, 0.0) for d in self.devices) / total if total else 0.0
                _spread(self._queue_buckets[q], self.bucket_s, self._last, self.sim.now, mine)
            self._jain_s += dt * jain(shares)
        self._last = self.sim.now

    # -- events ---------------------------------------------------------------------------------------
    def _feed(self, event: Event) -> None:
        self._advance()  # the time up to now, at the allocation it had
        for effect in self.core.handle(event):
            if isinstance(effect, JobStarted):
                self._started(effect.job)
            elif isinstance(effect, JobEnded):
                self._ended(effect.job, effect.state)
            elif isinstance(effect, JobRequeued):
                self._ended(effect.job, JobState.PENDING)

    def _cycle(self) -> None:
        before = self.core.reserved
        self._feed(Tick(self.sim.now, self._inventory))
        self._inventory = None
        for job, start in self.core.reserved.items():
            if before.get(job) != start:
                self.run.reservations.append((self.sim.now, job, start))
        due = self.core.next_wakeup()
        if due is not None and (self._woken is None or due < self._woken.time):
            if self._woken is not None:
                self._woken.cancel()
            self._woken = self.sim.at(due, self._wake_cycle)

    def _wake_cycle(self) -> None:
        self._woken = None
        self._cycle()

    def _arrive(self, name: str) -> None:
        trace = self.jobs[name].trace
        job = trace.job
        spec = JobSpec(
            name,
            job.queue,
            job.priority,
            job.gangs,
            job.elastic,
            requeue=trace.requeue,
            walltime_s=job.walltime_s,
        )
        self._feed(JobSubmitted(self.sim.now, spec))
        self._cycle()

    def _started(self, name: str) -> None:
        live = self.jobs[name]
        live.running, live.started = True, self.sim.now
        if live.first_start is None:
            live.first_start = self.sim.now
            self.run.waits.setdefault(live.trace.job.priority, []).append(self.sim.now - live.submitted)
        self.sim.after(live.left_s, partial(self._finish, name, self.sim.now))

    def _finish(self, name: str, started: float) -> None:
        live = self.jobs[name]
        if not live.running or live.started != started:
            return  # it ended before (evicted)
        live.left_s = 0.0
        self._feed(JobFinished(self.sim.now, JobId(name)))
        self._cycle()

    def _ended(self, name: str, state: JobState) -> None:
        """Done, or preempted (ended, or requeued: `state` PENDING): what it did since its last save
        (every `save_every_s`) is lost; the rest stays undone, or is done once admitted again."""
        live = self.jobs[name]
        if live.running:
            job = live.trace.job
            devices = sum(demand(job).get(d, 0.0) for d in self.devices)
            done = state is JobState.DONE
            self.run.intervals.append(
                Interval(name, job.queue, job.priority, live.started, self.sim.now, devices, done)
            )
        if state is JobState.DONE:
            self.run.completions.setdefault(live.trace.job.priority, []).append(self.sim.now - live.submitted)
        elif live.running:
            ran = self.sim.now - live.started
            saved = math.floor(ran / live.trace.save_every_s) * live.trace.save_every_s
            live.left_s = max(live.left_s - saved, 0.0)
            live.preempted += 1
        live.running = False

    def simulate(self) -> ClusterRun:
        self.sim.run()
        self._advance()
        self.run.makespan = self.sim.now
        self.run.preemptions = self.core.counts.preemptions
        self.run.grown = self.core.counts.grown
        if self.sim.now > 0:
            self.run.allocation = self._alloc_s / self.horizon_s if self.horizon_s > 0 else 0.0
            self.run.jain = self._jain_s / self.sim.now
        self.run.unfinished = sum(1 for j in self.jobs.values() if j.left_s > 0)
        self.run.allocation_series = self._per_bucket(self._buckets)
        self.run.queue_series = {q: self._per_bucket(b) for q, b in self._queue_buckets.items()}
        return self.run

    def _per_bucket(self, buckets: list[float]) -> list[float]:
        return [b / min(self.bucket_s, self.sim.now - k * self.bucket_s) for k, b in enumerate(buckets)]


def _spread(buckets: list[float], bucket_s: float, start: float, end: float, share: float) -> None:
    """Add `share` over [start, end) to the time buckets it covers."""
    t = start
    while t < end:
        k = int(t // bucket_s)
        while len(buckets) <= k:
            buckets.append(0.0)
        stop = min(end, (k + 1) * bucket_s)
        buckets[k] += (stop - t) * share
        t = stop


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything (1 if all are 0)."""
    total, squares = sum(xs), sum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares > 0 else 1.0


@dataclass(frozen=True)
class TraceClass:
    """One stream of jobs in a synthetic trace."""

    name: str  # a priority class
    queue: str
    rate_per_h: float  # Poisson arrivals
    devices: tuple[int, ...]  # a job's gang size in devices, drawn uniformly
    mean_work_s: float  # lognormal run time with this mean
    sigma: float = 1.0
    device: str = "GPU"
    cpus_per_device: float = 4.0
    per_node: int = 8  # devices per bundle (one node's worth)


def synthetic_trace(classes: Sequence[TraceClass], hours: float, seed: int) -> list[TraceJob]:
    rng = np.random.default_rng(seed)
    out: list[TraceJob] = []
    for c in classes:
        t, k = 0.0, 0
        while True:
            t += float(rng.exponential(3600.0 / c.rate_per_h))
            if t > hours * 3600.0:
                break
            n = int(rng.choice(c.devices))
            bundles = [min(c.per_node, n - i) for i in range(0, n, c.per_node)]
            gang = Gang(tuple({c.device: float(b), "CPU": c.cpus_per_device * b} for b in bundles))
            mu = math.log(c.mean_work_s) - c.sigma**2 / 2
            work = float(rng.lognormal(mu, c.sigma))
            out.append(TraceJob(PendingJob(f"{c.queue}/{c.name}-{k}", c.queue, c.name, t, (gang,)), work))
            k += 1
    return sorted(out, key=lambda j: j.job.submitted)


def summarise(run: ClusterRun) -> dict[str, float]:
    out = {"allocation": run.allocation, "jain": run.jain, "preemptions": float(run.preemptions)}
    for cls, waits in run.waits.items():
        out[f"{cls}_wait_mean_s"] = float(np.mean(waits))
        out[f"{cls}_wait_max_s"] = float(np.max(waits))
    for cls, done in run.completions.items():
        out[f"{cls}_completion_mean_s"] = float(np.mean(done))
    out["unfinished"] = float(run.unfinished)
    return out

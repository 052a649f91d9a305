"""Many jobs on one cluster in virtual time: a job trace through the admission policy the cluster
layer runs (`rlsched.policy.admission.admit`), with preemption, grace periods and lost work.

Every arrival, finish and completed eviction triggers one admission cycle, and so does the moment
a waiting job's answer may change without one (a running job's minimum run time ends, a waiting
job reaches its maximum wait). An admitted job runs for
its remaining work; an evicted one keeps running through its grace period, then stops: what it did
since its last save (every `save_every_s`) is lost and it goes back to the queue with the rest of its
work; an evicted elastic part just leaves (the job carries on without it) and comes back when there is room
again (`Grow`). Reported: the share of
devices allocated over time, each class's queueing delay and completion time, the maximum wait,
preemptions, and Jain's fairness index over the queues' dominant shares (time-weighted).

`synthetic_trace` draws a trace: Poisson arrivals per class, gang sizes, lognormal run times.
Virtual time throughout; the same seed gives the same run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from rlsched.policy.admission import admit, decay_usage
from rlsched.policy.cluster_model import (
    AdmissionParams,
    Admit,
    ClusterSnapshot,
    Evict,
    Grow,
    PendingJob,
    RunningJob,
    dominant_share,
    usage_by_queue,
)
from rlsched.policy.placement import Gang, Node, add
from rlsched.sim.engine import Simulator


@dataclass(frozen=True)
class TraceJob:
    job: PendingJob
    work_s: float  # run time when never interrupted
    save_every_s: float = 600.0


@dataclass
class _Live:
    trace: TraceJob
    left_s: float  # work still to do
    started: float = 0.0
    running: RunningJob | None = None
    evicting: bool = False
    evicting_elastic: bool = False
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


class ClusterSim:
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
        # allocation is measured while jobs arrive (to the last arrival), not over the drain after it
        self.horizon_s = max((t.job.submitted for t in trace), default=0.0)
        self.nodes, self.params, self.devices = tuple(nodes), params, tuple(devices)
        self.capacity = add(*(n.capacity for n in self.nodes))
        self.jobs = {t.job.name: _Live(t, t.work_s, submitted=t.job.submitted) for t in trace}
        self.pending: dict[str, PendingJob] = {}
        self.run = ClusterRun()
        self._last = 0.0
        self._alloc_s = 0.0
        self._jain_s = 0.0
        self._woken: float | None = None  # when the next wake-up cycle is due
        self._history: dict[str, dict[str, float]] = {}  # decayed usage per queue (usage_half_life_s)
        for t in trace:
            self.sim.at(t.job.submitted, partial(self._arrive, t.job.name))

    # -- accounting -------------------------------------------------------------------------------
    def _running(self) -> list[RunningJob]:
        return [j.running for j in self.jobs.values() if j.running is not None]

    def _advance(self) -> None:
        dt = self.sim.now - self._last
        if dt > 0:
            used = add(*(r.usage() for r in self._running()))
            total = sum(self.capacity.get(d, 0.0) for d in self.devices)
            share = sum(used.get(d, 0.0) for d in self.devices) / total if total else 0.0
            self._alloc_s += (
                max(0.0, min(self.sim.now, self.horizon_s) - min(self._last, self.horizon_s)) * share
            )
            self._spread(self._last, self.sim.now, share)
            shares = []
            for q, qp in self.params.queues.items():
                usage = add(*(r.usage() for r in self._running() if r.queue == q))
                shares.append(dominant_share(usage, self.capacity, qp.weight))
            self._jain_s += dt * jain(shares)
            if self.params.usage_half_life_s:
                now_usage = usage_by_queue(self._running())
                self._history = decay_usage(self._history, now_usage, dt, self.params.usage_half_life_s)
        self._last = self.sim.now

    def _spread(self, start: float, end: float, share: float) -> None:
        """Add `share` over [start, end) to the time buckets it covers."""
        t = start
        while t < end:
            k = int(t // self.bucket_s)
            while len(self._buckets) <= k:
                self._buckets.append(0.0)
            stop = min(end, (k + 1) * self.bucket_s)
            self._buckets[k] += (stop - t) * share
            t = stop

    # -- events ---------------------------------------------------------------------------------------
    def _arrive(self, name: str) -> None:
        self._advance()
        self.pending[name] = self.jobs[name].trace.job
        self._cycle()

    def _cycle(self) -> None:
        evicting = {
            n: j.evicting_elastic for n, j in self.jobs.items() if j.evicting and j.running is not None
        }
        history = self._history if self.params.usage_half_life_s else None
        snapshot = ClusterSnapshot(
            self.nodes, tuple(self._running()), tuple(self.pending.values()), evicting, history
        )
        for d in admit(snapshot, self.sim.now, self.params):
            if isinstance(d, Admit):
                self._start(d)
            elif isinstance(d, Evict):
                self._evict(d)
            elif isinstance(d, Grow):
                self._grow(d)
        self._wake()

    def _wake(self) -> None:
        """While jobs wait, cycle again when the answer may change without an event: a running job's
        minimum run time ends (it becomes a possible victim) or a waiting job reaches its maximum
        wait (it goes first)."""
        if not self.pending:
            return
        now = self.sim.now
        times = [r.started + self.params.classes[r.priority].min_run_s for r in self._running()] + [
            j.submitted + bound
            for j in self.pending.values()
            if (bound := self.params.classes[j.priority].max_wait_s) is not None
        ]
        later = [t for t in times if t > now + 1e-9]
        if later and (self._woken is None or self._woken <= now or min(later) < self._woken):
            self._woken = min(later)
            self.sim.at(self._woken, self._wake_cycle)

    def _wake_cycle(self) -> None:
        if self._woken is not None and abs(self._woken - self.sim.now) < 1e-9:
            self._woken = None
            self._advance()
            self._cycle()

    def _start(self, d: Admit) -> None:
        live = self.jobs[d.job]
        job = self.pending.pop(d.job)
        for n, other in self.pending.items():  # those evicted for it may start again
            if other.yield_to == d.job:
                self.pending[n] = replace(other, yield_to=None)
        allocs = tuple(
            (node, b)
            for g, pl in zip(job.gangs, d.placements, strict=True)
            for b, node in zip(g.bundles, pl.nodes, strict=True)
        )
        elastic = tuple(zip(d.elastic_nodes, job.elastic, strict=False))
        missing = job.elastic[len(elastic) :]
        live.running = RunningJob(
            job.name, job.queue, job.priority, self.sim.now, allocs, elastic, self.sim.now, missing
        )
        live.started = self.sim.now
        if live.first_start is None:
            live.first_start = self.sim.now
            self.run.waits.setdefault(job.priority, []).append(self.sim.now - live.submitted)
        self.sim.after(live.left_s, partial(self._finish, job.name, self.sim.now))

    def _grow(self, d: Grow) -> None:
        live = self.jobs[d.job]
        assert live.running is not None
        got = tuple(zip(d.elastic_nodes, live.running.missing, strict=False))
        live.running = replace(
            live.running,
            elastic=(*live.running.elastic, *got),
            missing=live.running.missing[len(got) :],
        )
        self.run.grown += len(got)

    def _finish(self, name: str, started: float) -> None:
        live = self.jobs[name]
        if live.running is None or live.started != started:
            return  # evicted meanwhile
        self._advance()
        live.running = None
        live.left_s = 0.0
        self.run.completions.setdefault(live.trace.job.priority, []).append(self.sim.now - live.submitted)
        self._cycle()

    def _evict(self, d: Evict) -> None:
        live = self.jobs[d.job]
        if live.running is None or live.evicting:
            return
        live.evicting, live.evicting_elastic = True, d.elastic_only
        self.run.preemptions += 1
        self.sim.after(d.grace_s, partial(self._evicted, d.job, d.elastic_only, live.started, d.for_job))

    def _evicted(self, name: str, elastic_only: bool, started: float, for_job: str) -> None:
        live = self.jobs[name]
        live.evicting = False
        if live.running is None or live.started != started:
            return  # it finished within its grace period
        self._advance()
        if elastic_only:
            parts = (*live.running.missing, *(r for _, r in live.running.elastic))
            live.running = replace(live.running, elastic=(), missing=parts)
            self._cycle()
            return
        ran = self.sim.now - live.started
        saved = math.floor(ran / live.trace.save_every_s) * live.trace.save_every_s
        live.left_s = max(live.left_s - saved, 0.0)
        live.running = None
        live.preempted += 1
        self.pending[name] = replace(live.trace.job, yield_to=for_job)
        self._cycle()

    def simulate(self) -> ClusterRun:
        self.sim.run()
        self._advance()
        self.run.makespan = self.sim.now
        if self.sim.now > 0:
            self.run.allocation = self._alloc_s / self.horizon_s if self.horizon_s > 0 else 0.0
            self.run.jain = self._jain_s / self.sim.now
        self.run.unfinished = sum(1 for j in self.jobs.values() if j.left_s > 0)
        self.run.allocation_series = [
            b / min(self.bucket_s, self.sim.now - k * self.bucket_s) for k, b in enumerate(self._buckets)
        ]
        return self.run


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

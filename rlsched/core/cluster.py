"""The cluster scheduler's state core: the jobs, what each holds, and every rule between admissions.

The Ray scheduler actor (`actors.cluster`) and the cluster simulator (`rlsched.sim.cluster`) both
drive this class. Events in, stamped with the driver's clock; effects out, carried out in order:

- `JobSubmitted` is checked (its queue and priority class exist, its name is not live) and the job
  waits; a refusal is a `Refused` with the reason and the fix.
- `Tick` runs one admission cycle: grace periods that ended first (the job's placement groups go
  whether or not its driver answered: an evicted job ends PREEMPTED, an evicted elastic part just
  leaves), then `rlsched.policy.admission.admit` over the nodes the driver saw. `Admit` starts a job
  (`CreatePlacementGroup` per gang and per elastic part granted, `JobStarted`); `Evict` orders a job
  (or only its elastic parts) out by a deadline, `Grow` gives parts back, `Wait` is the reason shown.
- A driver reports `PartReleased`, `JobFinished`, `JobFailed` and `PlacementFailed`; `DriversAlive`
  ends the running jobs whose driver has been gone for a while.
- A supervised job (`JobSpec.requeue`: `rlsched submit`, `rlsched run --requeue`) is requeued rather
  than ended (Kueue's requeuing): preempted, it waits again at once; failed, it waits out a backoff
  (`rlsched.policy.durability.requeue_delay`) and, after too many failures, is parked with the
  reason. Its supervisor's next attempt registers again and takes the entry back; each attempt's
  failure counts once, whoever reports it.
- Usage per queue decays with `usage_half_life_s`, integrated at every event.

`next_wakeup` is when a cycle may decide differently without any event: a grace period ends, and,
while jobs wait, a running job's minimum run time ends, a waiting job's maximum wait is reached, or a
reservation is due to begin (`rlsched.policy.reservation`: if the jobs it waits for overran their
walltimes, it moves).
The job lifecycle is `JobState` (`rlsched.policy.lifecycle`); every move is checked against it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rlsched.core.cluster_io import (
    CancelRequested,
    CreatePlacementGroup,
    DriversAlive,
    Effect,
    Event,
    GroupId,
    JobEnded,
    JobFailed,
    JobFinished,
    JobId,
    JobRequeued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    PartId,
    PartReleased,
    PlacementFailed,
    Refused,
    RemovePlacementGroup,
    Tick,
)
from rlsched.core.trace import Trace
from rlsched.policy.admission import admit, decay_usage
from rlsched.policy.cluster_model import (
    AdmissionParams,
    Admit,
    ClusterSnapshot,
    Evict,
    Grow,
    PendingJob,
    RunningJob,
    Wait,
    usage_by_queue,
)
from rlsched.policy.durability import requeue_delay
from rlsched.policy.lifecycle import JOB_TRANSITIONS, JobState, job_transition
from rlsched.policy.placement import Node, Resources, minus

# -- state -----------------------------------------------------------------------------------------


@dataclass
class _Part:
    node: str
    group: GroupId
    resources: Resources
    release_by: float | None = None  # asked to give it back by then


@dataclass
class _Job:
    spec: JobSpec
    submitted: float
    state: JobState = JobState.PENDING
    reason: str = "waiting for the next admission cycle"
    started: float | None = None
    gangs: list[tuple[GroupId, list[tuple[str, Resources]]]] = field(default_factory=list)
    parts: dict[PartId, _Part] = field(default_factory=dict)  # elastic parts held
    next_part: int = 0
    stop_by: float | None = None  # asked to stop as a whole by then
    why_evicted: str = ""
    cancel: bool = False
    failures: int = 0  # failures requeued (a supervised job)
    requeues: int = 0  # times requeued, after preemptions and failures
    not_before: float | None = None  # backing off after a failure: not admitted before then
    attempt_over: int = -1  # the newest supervisor attempt already ended (requeued or failed)
    requeued_why: str = ""  # why it was last requeued (its reason moves on with the admission cycles)
    reserved_from: float | None = None  # past its maximum wait: when its reservation begins

    def to(self, target: JobState) -> None:
        if target not in JOB_TRANSITIONS[self.state]:
            job_transition(self.state, target)  # raises, naming the edges allowed
        self.state = target

    @property
    def live(self) -> bool:
        return self.state in (JobState.PENDING, JobState.RUNNING)


@dataclass
class ClusterCounts:
    preemptions: int = 0  # evictions ordered (a job's, or its elastic parts')
    grown: int = 0  # elastic parts granted again to running jobs
    requeued: int = 0  # supervised jobs sent back to wait (preempted or failed)
    parked: int = 0


class ClusterCore:
    def __init__(
        self, params: AdmissionParams, defaults: Mapping[str, str] | None = None, at: float = 0.0
    ) -> None:
        self.params = params
        self.defaults = dict(defaults or {})  # queue -> its default priority class
        self.jobs: dict[JobId, _Job] = {}
        self.nodes: tuple[Node, ...] = ()
        self.history: dict[str, dict[str, float]] = {}  # decayed usage per queue
        self.counts = ClusterCounts()
        self.cycles = 0
        self.reserved: dict[JobId, float] = {}  # the last cycle's reservations: job -> when it begins
        self._last = at
        self._out: list[Effect] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            JobSubmitted: self._submit,
            Tick: self._cycle,
            PartReleased: self._part_released,
            JobFinished: self._finished,
            JobFailed: self._failed,
            CancelRequested: self._cancel,
            PlacementFailed: self._placement_failed,
            DriversAlive: self._reap,
        }

    def handle(self, event: Event) -> list[Effect]:
        """Take in one event; the effects, in the order they are to be carried out."""
        self._account(event.at)
        self._handlers[type(event)](event)
        out, self._out = self._out, []
        return out

    # -- views (what drivers and the CLI read) -------------------------------------------------------

    def running(self) -> list[RunningJob]:
        return [self._running(j) for j in self.jobs.values() if j.state is JobState.RUNNING]

    def poll(self, name: str, now: float) -> dict[str, Any]:
        """What the job's driver must know: its state and reason, its gangs' groups, elastic parts to
        start or give back (seconds left), whether to stop."""
        job = self.jobs.get(JobId(name))
        if job is None:
            return {"state": "unknown"}
        return {
            "state": str(job.state),
            "reason": job.reason,
            "gangs": [g for g, _ in job.gangs],
            "parts": {p: part.group for p, part in job.parts.items() if part.release_by is None},
            "release": {
                p: max(0.0, part.release_by - now) for p, part in job.parts.items() if part.release_by
            },
            "stop_in": None if job.stop_by is None else max(0.0, job.stop_by - now),
            "why": job.why_evicted,
            "cancel": job.cancel,
            "requeued": job.requeued_why,
        }

    def waiting(self, now: float) -> list[dict[str, Any]]:
        return [
            {
                "job": n,
                "queue": j.spec.queue,
                "priority": j.spec.priority,
                "waiting_s": round(now - j.submitted, 1),
                "reason": j.reason,
            }
            for n, j in sorted(self.jobs.items(), key=lambda kv: kv[1].submitted)
            if j.state is JobState.PENDING
        ]

    def status(self) -> dict[str, Any]:
        free = self.free()
        return {
            "cycles": self.cycles,
            "nodes": [
                {"name": n.name, "capacity": n.capacity, "free": free.get(n.name, {})} for n in self.nodes
            ],
            "jobs": {
                n: {
                    "state": str(j.state),
                    "queue": j.spec.queue,
                    "priority": j.spec.priority,
                    "nodes": sorted({node for _, bundles in j.gangs for node, _ in bundles}),
                    "elastic": {p: part.node for p, part in j.parts.items()},
                    "reason": j.reason if j.state is not JobState.RUNNING else "",
                    "failures": j.failures,
                    "requeues": j.requeues,
                }
                for n, j in self.jobs.items()
            },
            "usage": usage_by_queue(self.running()),
        }

    def held_groups(self) -> list[tuple[JobId, GroupId, PartId | None]]:
        """Every placement group the core believes exists: each running job's gangs (part None) and
        elastic parts. A restarted driver checks them against what Ray holds."""
        out: list[tuple[JobId, GroupId, PartId | None]] = []
        for name, job in self.jobs.items():
            if job.state is JobState.RUNNING:
                out += [(name, group, None) for group, _ in job.gangs]
                out += [(name, p.group, part) for part, p in job.parts.items()]
        return out

    def free(self) -> dict[str, Resources]:
        free: dict[str, Resources] = {n.name: dict(n.capacity) for n in self.nodes}
        for r in self.running():
            for node, res in (*r.allocations, *r.elastic):
                if node in free:
                    free[node] = minus(free[node], res)
        return free

    def next_wakeup(self) -> float | None:
        """When a cycle may decide differently without an event (see the module's docstring)."""
        now = self._last
        # grace periods: due even now (a grace of 0 s ends at the next cycle); they go once expired
        graces = [
            p.release_by for j in self.jobs.values() for p in j.parts.values() if p.release_by is not None
        ]
        graces += [
            j.stop_by for j in self.jobs.values() if j.stop_by is not None and j.state is JobState.RUNNING
        ]
        times: list[float] = []
        pending = [j for j in self.jobs.values() if j.state is JobState.PENDING]
        if pending:
            classes = self.params.classes
            times += [
                j.started + classes[j.spec.priority].min_run_s
                for j in self.jobs.values()
                if j.state is JobState.RUNNING and j.started is not None
            ]
            times += [
                j.submitted + bound
                for j in pending
                if (bound := classes[j.spec.priority].max_wait_s) is not None
            ]
        times += [j.not_before for j in pending if j.not_before is not None]
        # a reservation's start: the jobs it waits for may have overrun, and the reservation moves
        times += [j.reserved_from for j in pending if j.reserved_from is not None]
        later = [t for t in times if t > now + 1e-9] + graces
        return max(now, min(later)) if later else None

    # -- events ------------------------------------------------------------------------------------

    def _account(self, at: float) -> None:
        """Usage per queue decays over the time since the last event, at the usage of that time."""
        if self.params.usage_half_life_s and at > self._last:
            usage = usage_by_queue(self.running())
            self.history = decay_usage(self.history, usage, at - self._last, self.params.usage_half_life_s)
        self._last = max(self._last, at)

    def _submit(self, event: JobSubmitted) -> None:
        spec, name = event.spec, JobId(event.spec.name)
        old = self.jobs.get(name)
        if old is not None and old.live and old.spec.requeue and spec.requeue:
            old.spec = replace(old.spec, attempt=spec.attempt)  # its supervisor's next attempt
            return
        reason = self._refusal(spec)
        if reason:
            self._out.append(Refused(name, reason))
            return
        if not spec.priority:
            spec = replace(spec, priority=self.defaults[spec.queue])
        self.jobs[name] = _Job(spec, event.at)

    def _refusal(self, spec: JobSpec) -> str:
        queues, classes = self.params.queues, self.params.classes
        if spec.queue not in queues:
            return f"queue {spec.queue!r} is not defined (queues: {', '.join(sorted(queues))})"
        if not spec.priority and spec.queue not in self.defaults:
            return f"queue {spec.queue!r} has no default priority class; give one with --priority"
        priority = spec.priority or self.defaults[spec.queue]
        if priority not in classes:
            return f"priority class {priority!r} is not defined (classes: {', '.join(sorted(classes))})"
        old = self.jobs.get(JobId(spec.name))
        if old is not None and old.live:
            return f"a job named {spec.name!r} is already {old.state}; give this one another name (--out)"
        return ""

    def _part_released(self, event: PartReleased) -> None:
        job = self.jobs.get(event.job)
        if job is not None and event.part in job.parts:
            self._drop_part(job, event.part)

    def _finished(self, event: JobFinished) -> None:
        job = self.jobs.get(event.job)
        if job is None or not job.live:
            return  # a late answer (it was ended already) changes nothing
        if event.preempted and job.spec.requeue and not job.cancel and job.state is JobState.RUNNING:
            self._requeue(job, event.at, f"preempted ({job.why_evicted or 'told to stop'})")
            return
        self._release_all(job)
        if job.state is JobState.PENDING or job.cancel:
            self._end(job, JobState.CANCELLED)
        else:
            self._end(job, JobState.PREEMPTED if event.preempted else JobState.DONE)

    def _failed(self, event: JobFailed) -> None:
        job = self.jobs.get(event.job)
        if job is None or not job.live or event.attempt <= job.attempt_over:
            return  # ended already, or this attempt's end was counted
        if job.cancel:
            self._release_all(job)
            self._end(job, JobState.CANCELLED)
        elif job.spec.requeue:
            self._fail_supervised(job, event.at, event.reason)
        else:
            self._release_all(job)
            self._end(job, JobState.FAILED)
            job.reason = f"failed: {event.reason}"

    def _fail_supervised(self, job: _Job, at: float, reason: str) -> None:
        """A supervised job's attempt failed: wait out a backoff and come back, or, after too many
        failures, park it with the reason."""
        job.failures += 1
        q = self.params.requeue
        delay = requeue_delay(job.failures, q.base_s, q.max_s, q.limit)
        if delay is None:
            self._release_all(job)
            job.attempt_over = job.spec.attempt
            self._end(job, JobState.PARKED)
            self.counts.parked += 1
            job.reason = (
                f"parked after {job.failures} failures (the last: {reason}); fix the cause, then "
                "submit it again with --resume"
            )
            return
        of = f" of {q.limit}" if q.limit is not None else ""
        self._requeue(
            job, at, f"failed ({reason}); retry {job.failures}{of} after a {delay:g} s backoff", at + delay
        )

    def _requeue(self, job: _Job, at: float, why: str, not_before: float | None = None) -> None:
        """Back to wait, from its last checkpoint: its groups go, its place in the queue is now."""
        self._release_all(job)
        if job.state is JobState.RUNNING:
            job.to(JobState.PENDING)
        job.started, job.stop_by, job.why_evicted, job.not_before = None, None, "", not_before
        job.submitted = at  # Kueue's default: a requeued job queues from its eviction
        job.requeues += 1
        job.attempt_over = job.spec.attempt
        job.reason = job.requeued_why = f"{why}; requeued, resumes from its last checkpoint when admitted"
        self.counts.requeued += 1
        self._out.append(JobRequeued(JobId(job.spec.name), job.reason, not_before))

    def _cancel(self, event: CancelRequested) -> None:
        job = self.jobs.get(event.job)
        if job is None or not job.live:
            live = [n for n, j in self.jobs.items() if j.live]
            self._out.append(
                Refused(
                    event.job,
                    f"no pending or running job named {event.job!r} (live: {', '.join(live) or 'none'})",
                )
            )
            return
        job.cancel = True
        if job.state is JobState.PENDING:
            self._end(job, JobState.CANCELLED)
            job.reason = "cancelled"

    def _placement_failed(self, event: PlacementFailed) -> None:
        job = self.jobs.get(event.job)
        if job is None:
            return
        if event.part is not None:
            job.parts.pop(event.part, None)
            return
        self._release_all(job)
        job.to(JobState.PENDING)
        job.started, job.reason = None, event.reason

    def _reap(self, event: DriversAlive) -> None:
        for name, job in self.jobs.items():
            started = job.started if job.started is not None else event.at
            if (
                job.state is JobState.RUNNING
                and name not in event.alive
                and event.at - started > event.after_s
            ):
                if job.spec.requeue:
                    self._fail_supervised(job, event.at, "its driver is gone")
                    continue
                self._release_all(job)
                self._end(job, JobState.PREEMPTED)
                job.reason = "its driver is gone; its placement groups were removed"

    # -- the admission cycle -------------------------------------------------------------------------

    def _cycle(self, event: Tick) -> None:
        now = event.at
        self._expire(now)
        if event.nodes is not None:
            self.nodes = event.nodes
        snapshot = ClusterSnapshot(
            self.nodes,
            tuple(self.running()),
            tuple(
                PendingJob(
                    n,
                    j.spec.queue,
                    j.spec.priority,
                    j.submitted,
                    j.spec.gangs,
                    j.spec.elastic,
                    walltime_s=j.spec.walltime_s,
                )
                for n, j in self.jobs.items()
                if j.state is JobState.PENDING and (j.not_before is None or j.not_before <= now)
            ),
            {
                n: j.stop_by is None
                for n, j in self.jobs.items()
                if j.state is JobState.RUNNING
                and (j.stop_by is not None or any(p.release_by for p in j.parts.values()))
            },
            self.history if self.params.usage_half_life_s else None,
        )
        self.reserved = {}
        for d in admit(snapshot, now, self.params):
            job = self.jobs[JobId(d.job)]
            if isinstance(d, Admit):
                self._start(job, d, now)
            elif isinstance(d, Evict):
                self._evict(job, d, now)
            elif isinstance(d, Grow):
                self.counts.grown += self._grow(job, d.elastic_nodes)
            elif isinstance(d, Wait):
                job.reason, job.reserved_from = d.reason, d.reserved_from
                if d.reserved_from is not None:
                    self.reserved[JobId(d.job)] = d.reserved_from
        self.cycles += 1

    def _running(self, job: _Job) -> RunningJob:
        assert job.started is not None
        return RunningJob(
            job.spec.name,
            job.spec.queue,
            job.spec.priority,
            job.started,
            tuple(b for _, bundles in job.gangs for b in bundles),
            tuple((p.node, p.resources) for p in job.parts.values()),
            None,
            job.spec.elastic[len(job.parts) :],
            job.spec.walltime_s,
        )

    def _start(self, job: _Job, d: Admit, now: float) -> None:
        name = JobId(job.spec.name)
        for i, (gang, placed) in enumerate(zip(job.spec.gangs, d.placements, strict=True)):
            group = GroupId(f"rlsched-{name}-g{i}")
            bundles = tuple(gang.bundles)
            job.gangs.append((group, list(zip(placed.nodes, bundles, strict=True))))
            self._out.append(
                CreatePlacementGroup(group, name, bundles, tuple(placed.nodes), gang.strategy.value)
            )
        job.to(JobState.RUNNING)
        job.started, job.reason, job.reserved_from = now, "", None
        self._out.append(JobStarted(name))
        self._grow(job, d.elastic_nodes)

    def _grow(self, job: _Job, nodes: tuple[str, ...]) -> int:
        """Grant the job's missing elastic parts on `nodes`; how many."""
        wanted = job.spec.elastic[len(job.parts) :]
        granted = 0
        for node, res in zip(nodes, wanted, strict=False):
            part = PartId(f"elastic-{job.next_part}")
            job.next_part += 1
            group = GroupId(f"rlsched-{job.spec.name}-{part}")
            job.parts[part] = _Part(node, group, res)
            self._out.append(CreatePlacementGroup(group, JobId(job.spec.name), (res,), (node,), "PACK", part))
            granted += 1
        return granted

    def _evict(self, job: _Job, d: Evict, now: float) -> None:
        job.why_evicted = f"for {d.for_job}: {d.reason}"
        if d.elastic_only:
            fresh = [p for p in job.parts.values() if p.release_by is None]
            for part in fresh:
                part.release_by = now + d.grace_s
            self.counts.preemptions += bool(fresh)
        elif job.stop_by is None:
            job.stop_by = now + d.grace_s
            self.counts.preemptions += 1

    def _expire(self, now: float) -> None:
        """Grace periods that ended: the groups go whether or not the owner answered."""
        for job in self.jobs.values():
            for p, part in list(job.parts.items()):
                if part.release_by is not None and now >= part.release_by:
                    self._drop_part(job, p)
            if job.state is JobState.RUNNING and job.stop_by is not None and now >= job.stop_by:
                if job.spec.requeue and not job.cancel:
                    self._requeue(job, now, f"preempted ({job.why_evicted}; its grace period ended)")
                    continue
                self._release_all(job)
                self._end(job, JobState.PREEMPTED)

    def _end(self, job: _Job, state: JobState) -> None:
        job.to(state)
        self._out.append(JobEnded(JobId(job.spec.name), state))

    def _drop_part(self, job: _Job, part: PartId) -> None:
        self._out.append(RemovePlacementGroup(job.parts.pop(part).group))

    def _release_all(self, job: _Job) -> None:
        for group, _ in job.gangs:
            self._out.append(RemovePlacementGroup(group))
        for p in list(job.parts):
            self._drop_part(job, p)
        job.gangs = []


ClusterTrace = Trace[ClusterCore, Event, Effect]  # what `actors.cluster.Scheduler.record` keeps

"""What the admission policy reads and returns, and the queue arithmetic under it.

Parameters (classes, queues, the admin's rules), the cluster snapshot (nodes, running and pending
jobs, evictions under way, decayed usage), the decisions `admit` returns (`Admit`, `Evict`, `Wait`,
`Grow`), and the bookkeeping every part of admission shares: free capacity per node, usage per
queue, dominant shares, and quotas with borrowing from a cohort (`lendable`, `quota_check`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rlsched.policy.placement import Gang, Node, Placement, Resources, add, minus

_EPS = 1e-9


@dataclass(frozen=True)
class ClassParams:
    value: int
    preemptible: bool = True
    grace_s: float = 30.0
    min_run_s: float = 0.0
    max_wait_s: float | None = None
    walltime_s: float = 86400.0  # a job's expected run time when it declares none (reservations)


@dataclass(frozen=True)
class QueueParams:
    cohort: str | None = None
    weight: float = 1.0
    nominal: Resources = field(default_factory=dict)
    borrowing_limit: Resources | None = None  # None, or a resource it does not name: any
    lending_limit: Resources | None = None  # None, or a resource it does not name: all its idle nominal


@dataclass(frozen=True)
class RequeueParams:
    """How a supervised job comes back (Kueue's requeuing strategy): after a preemption at once; after
    a failure with exponential backoff, `base_s` doubling up to `max_s`; after `limit` failures
    requeued, the next one parks it (None: never parked)."""

    base_s: float = 30.0
    max_s: float = 1800.0
    limit: int | None = 5


@dataclass(frozen=True)
class AdmissionParams:
    classes: Mapping[str, ClassParams]
    queues: Mapping[str, QueueParams]
    within_queue: bool = True
    reclaim_borrowed: bool = True
    borrow_within_cohort: bool = True  # a job may take from lower-priority borrowers while it borrows
    never_below_nominal: bool = True  # no victim's queue is taken below its nominal quota
    drf: bool = True
    reserve: Resources | None = None  # kept free on one node for `reserve_classes` (SPEC section 5)
    reserve_classes: frozenset[str] = frozenset()
    usage_half_life_s: float | None = None  # for whoever keeps ClusterSnapshot.history (not used by admit)
    device_types: frozenset[str] = frozenset()
    requeue: RequeueParams = field(default_factory=RequeueParams)
    overrun_grace_s: float = 600.0  # a job past its walltime is expected to end within this, then again
    max_reservations: int = 8  # jobs past their maximum wait that hold a reservation at once, first first


@dataclass(frozen=True)
class PendingJob:
    name: str
    queue: str
    priority: str  # a class name
    submitted: float
    gangs: tuple[Gang, ...]  # all placed together or none (the training gang, the verifier pool ...)
    elastic: tuple[Resources, ...] = ()  # rollout instances: placed where room is left, preempted first
    yield_to: str | None = None  # evicted for this job: waits while it does (its capacity is for it)
    walltime_s: float | None = None  # its expected run time (None: its class's default)


@dataclass(frozen=True)
class RunningJob:
    name: str
    queue: str
    priority: str
    started: float
    allocations: tuple[tuple[str, Resources], ...]  # (node, resources) of its gangs
    elastic: tuple[tuple[str, Resources], ...] = ()  # (node, resources) of each elastic part
    last_save: float | None = None  # when its work was last saved (None: never; counts from start)
    missing: tuple[Resources, ...] = ()  # elastic parts it wants but does not hold (granted by Grow)
    walltime_s: float | None = None  # its expected run time (None: its class's default)

    def usage(self) -> dict[str, float]:
        return add(*(r for _, r in self.allocations), *(r for _, r in self.elastic))


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...]
    pending: tuple[PendingJob, ...]
    evicting: Mapping[str, bool] = field(default_factory=dict)  # job -> only its elastic parts: going
    history: Mapping[str, Resources] | None = None  # queue -> decayed usage (fairness over history)


@dataclass(frozen=True)
class Admit:
    job: str
    placements: tuple[Placement, ...]  # one per gang
    elastic_nodes: tuple[str, ...]  # one per elastic part placed (the rest wait for room)
    borrowed: Mapping[str, float]


@dataclass(frozen=True)
class Evict:
    job: str
    elastic_only: bool  # only its elastic parts go; the job keeps running
    grace_s: float
    for_job: str
    reason: str


@dataclass(frozen=True)
class Wait:
    job: str
    reason: str
    reserved_from: float | None = None  # past its maximum wait: when its reservation begins


@dataclass(frozen=True)
class Grow:
    """A running job gets back elastic parts it lacks (one node per part, in `RunningJob.missing` order)."""

    job: str
    elastic_nodes: tuple[str, ...]


Decision = Admit | Evict | Wait | Grow


# -- bookkeeping ----------------------------------------------------------------------------------


def capacity_of(nodes: Sequence[Node]) -> dict[str, float]:
    return add(*(n.capacity for n in nodes))


def free_of(nodes: Sequence[Node], running: Sequence[RunningJob]) -> dict[str, dict[str, float]]:
    free = {n.name: dict(n.capacity) for n in nodes}
    for job in running:
        for node, res in (*job.allocations, *job.elastic):
            if node in free:
                free[node] = minus(free[node], res)
    return free


def usage_by_queue(running: Sequence[RunningJob]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for job in running:
        out[job.queue] = add(out.get(job.queue, {}), job.usage())
    return out


def demand(job: PendingJob) -> dict[str, float]:
    return add(*(g.total() for g in job.gangs))


def dominant_share(usage: Resources, capacity: Resources, weight: float) -> float:
    shares = [v / capacity[k] for k, v in usage.items() if capacity.get(k, 0.0) > 0]
    return max(shares, default=0.0) / weight


def over(usage: Resources, limit: Resources) -> dict[str, float]:
    """What `usage` has beyond `limit`, per resource (resources absent from `limit` are unlimited
    only if `limit` is None; here an absent key means 0 nominal)."""
    return {k: v - limit.get(k, 0.0) for k, v in usage.items() if v > limit.get(k, 0.0) + _EPS}


# -- quotas ------------------------------------------------------------------------------------------


def lendable(queue: str, params: AdmissionParams, usage: Mapping[str, Resources]) -> dict[str, float]:
    """What the other queues of `queue`'s cohort leave idle of their nominal quota and may lend,
    less what others already borrow from the cohort."""
    cohort = params.queues[queue].cohort
    if cohort is None:
        return {}
    pool: dict[str, float] = {}
    borrowed: dict[str, float] = {}
    for name, q in params.queues.items():
        if q.cohort != cohort:
            continue
        used = usage.get(name, {})
        if name != queue:
            idle = {k: max(0.0, v - used.get(k, 0.0)) for k, v in q.nominal.items()}
            if q.lending_limit is not None:
                idle = {k: min(v, q.lending_limit.get(k, v)) for k, v in idle.items()}  # absent: all
            pool = add(pool, idle)
        borrowed = add(borrowed, over(used, q.nominal)) if name != queue else borrowed
    return {k: max(0.0, v - borrowed.get(k, 0.0)) for k, v in pool.items()}


def quota_check(
    job: PendingJob, params: AdmissionParams, usage: Mapping[str, Resources]
) -> tuple[dict[str, float] | None, str]:
    """(what the job would borrow, "") if its queue can take it, else (None, the reason)."""
    q = params.queues[job.queue]
    after = add(usage.get(job.queue, {}), demand(job))
    extra = over(after, q.nominal)
    if not extra:
        return {}, ""
    if q.cohort is None:
        return None, _over_quota(job, q, after, "and it has no cohort to borrow from")
    if q.borrowing_limit is not None:
        limit = q.borrowing_limit  # a resource it does not name: any
        beyond = {k: v for k, v in extra.items() if k in limit and v > limit[k] + _EPS}
        if beyond:
            k = next(iter(beyond))
            return None, _over_quota(
                job, q, after, f"beyond its borrowing limit of {q.borrowing_limit.get(k, 0.0):g} {k}"
            )
    pool = lendable(job.queue, params, usage)
    short = {k: v for k, v in extra.items() if v > pool.get(k, 0.0) + _EPS}
    if short:
        k = next(iter(short))
        return None, _over_quota(job, q, after, f"and cohort {q.cohort} has {pool.get(k, 0.0):g} {k} to lend")
    return extra, ""


def _over_quota(job: PendingJob, q: QueueParams, after: Resources, why: str) -> str:
    k = next(k for k, v in after.items() if v > q.nominal.get(k, 0.0) + _EPS)
    return (
        f"queue {job.queue} would use {after[k]:g} {k} with this job, over its nominal quota of "
        f"{q.nominal.get(k, 0.0):g} {k}, {why}"
    )

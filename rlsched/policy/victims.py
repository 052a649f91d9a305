"""Who leaves so that a job can start, and who gets back what it lacks: the victims of preemption
(`candidates`, `choose_victims`) and the growth of running jobs' elastic parts (`grow`).

The rules are those `rlsched.policy.admission` states in its docstring: victims are preemptible
jobs past their minimum run time, of lower priority in the same queue or borrowing beyond their
nominal quota; elastic parts go before whole jobs, then the lowest priority, then the least work
lost since the last save; a whole job is never taken below its queue's nominal quota. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlsched.policy.cluster_model import (
    _EPS,
    AdmissionParams,
    ClusterSnapshot,
    Decision,
    Grow,
    PendingJob,
    QueueParams,
    RunningJob,
    demand,
    over,
    quota_check,
)
from rlsched.policy.cluster_place import place_all
from rlsched.policy.placement import (
    Gang,
    Node,
    Resources,
    add,
    fits,
    minus,
)

# -- victims -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    job: RunningJob
    elastic_only: bool
    releases: tuple[tuple[str, Resources], ...]
    why: str


def candidates(
    job: PendingJob,
    snapshot: ClusterSnapshot,
    now: float,
    params: AdmissionParams,
    usage: Mapping[str, Resources],
) -> list[Candidate]:
    """Who may be asked to leave for `job`, in the order they should go."""
    mine = params.classes[job.priority]
    q = params.queues[job.queue]
    reclaims = params.reclaim_borrowed and not over(add(usage.get(job.queue, {}), demand(job)), q.nominal)
    out: list[tuple[tuple[int, int, float, str], Candidate]] = []
    for victim in snapshot.running:
        cls = params.classes[victim.priority]
        if not cls.preemptible or now - victim.started < cls.min_run_s:
            continue
        lower_here = params.within_queue and victim.queue == job.queue and cls.value < mine.value
        vq = params.queues[victim.queue]
        borrowing = over(usage.get(victim.queue, {}), vq.nominal)
        shares_cohort = victim.queue != job.queue and vq.cohort is not None and vq.cohort == q.cohort
        reclaim = reclaims and shares_cohort and bool(borrowing)
        lower_borrower = (
            params.borrow_within_cohort and shares_cohort and bool(borrowing) and cls.value < mine.value
        )
        if not (lower_here or reclaim or lower_borrower):
            continue
        if lower_here:
            why = f"lower priority ({victim.priority}) in queue {victim.queue}"
        elif reclaim:
            why = f"queue {victim.queue} borrows beyond its nominal quota and {job.queue} reclaims it"
        else:
            why = f"lower priority ({victim.priority}) borrowing in cohort {vq.cohort}"
        lost = now - (victim.last_save if victim.last_save is not None else victim.started)
        if victim.elastic:
            out.append(((0, cls.value, lost, victim.name), Candidate(victim, True, victim.elastic, why)))
        if not lower_here and params.never_below_nominal and not _stays_above_nominal(victim, usage, vq):
            continue  # taking the whole job would push its queue below its guarantee
        whole = (*victim.allocations, *victim.elastic)
        out.append(((1, cls.value, lost, victim.name), Candidate(victim, False, whole, why)))
    return [c for _, c in sorted(out, key=lambda kv: kv[0])]


def _stays_above_nominal(victim: RunningJob, usage: Mapping[str, Resources], q: QueueParams) -> bool:
    after = minus(usage.get(victim.queue, {}), victim.usage())
    return all(
        after.get(k, 0.0) >= q.nominal.get(k, 0.0) - _EPS for k in victim.usage() if q.nominal.get(k, 0.0) > 0
    )


def choose_victims(
    job: PendingJob,
    snapshot: ClusterSnapshot,
    now: float,
    params: AdmissionParams,
    free: Mapping[str, Resources],
    usage: Mapping[str, Resources],
    keep: Resources | None = None,
    able_by_kind: dict[frozenset[str], list[Node]] | None = None,
) -> list[Candidate] | None:
    """Candidates taken in order until `job` fits its queue's quota and every gang of it can be
    placed (None: not even all of them would do)."""
    ordered = candidates(job, snapshot, now, params, usage)
    if not ordered:
        return None
    left = {n: dict(r) for n, r in free.items()}
    used = {q: dict(u) for q, u in usage.items()}
    chosen: list[Candidate] = []
    elastic_gone: set[str] = set()
    whole_gone: set[str] = set()
    for cand in ordered:
        name = cand.job.name
        if name in whole_gone:
            continue
        if cand.elastic_only:
            releases = cand.job.elastic
            elastic_gone.add(name)
        else:
            releases = cand.job.allocations if name in elastic_gone else cand.releases
            whole_gone.add(name)
            chosen = [c for c in chosen if c.job.name != name]  # the whole job supersedes its part
        for node, res in releases:
            if node in left:
                left[node] = add(left[node], res)
            used[cand.job.queue] = minus(used.get(cand.job.queue, {}), res)
        chosen.append(cand)
        quota_ok = quota_check(job, params, used)[0] is not None
        if quota_ok and not isinstance(place_all(job, snapshot.nodes, left, params, keep, able_by_kind), str):
            return chosen
    return None


def grow(
    snapshot: ClusterSnapshot,
    params: AdmissionParams,
    free: dict[str, Resources],
    usage: dict[str, dict[str, float]],
    evicting: set[str],
    reserve: Resources,
) -> list[Decision]:
    """Running jobs' missing elastic parts, on what the pending jobs left (their holds included),
    within quota, highest priority first; a job being evicted gets nothing back."""
    out: list[Decision] = []
    jobs = [r for r in snapshot.running if r.missing and r.name not in evicting]
    for job in sorted(jobs, key=lambda r: (-params.classes[r.priority].value, r.started, r.name)):
        nodes: list[str] = []
        for part in job.missing:
            if (
                quota_check(
                    PendingJob(job.name, job.queue, job.priority, 0.0, (Gang((part,)),)), params, usage
                )[0]
                is None
            ):
                break
            keep = None if job.priority in params.reserve_classes or not any(reserve.values()) else reserve
            node = next(
                (n.name for n in snapshot.nodes if fits(part, free[n.name])
                 and (not keep or _keeps(keep, snapshot.nodes, free, n.name, part))),
                None,
            )  # fmt: skip
            if node is None:
                break
            free[node] = minus(free[node], part)
            usage[job.queue] = add(usage.get(job.queue, {}), part)
            nodes.append(node)
        if nodes:
            out.append(Grow(job.name, tuple(nodes)))
    return out


def _keeps(
    keep: Resources, nodes: Sequence[Node], free: Mapping[str, Resources], node: str, part: Resources
) -> bool:
    left = {**free, node: minus(free[node], part)}
    return any(fits(keep, left[n.name]) for n in nodes)

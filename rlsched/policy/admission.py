"""Admission of RL jobs to a shared cluster: order, quotas with borrowing, gang placement, victims.

One call, `admit(snapshot, now, params)`, looks at the nodes, the running jobs and the pending ones
and returns decisions: `Admit` (a job's gangs placed, all of them), `Evict` (a running job, or its
elastic part, asked to save or drain within its grace period so that a waiting job can start),
`Wait` (a pending job stays pending, with the reason in words), and `Grow` (a running job gets back
elastic parts it lacks, on what the pending jobs leave, within quota).

Order: jobs that fit their queue's nominal quota before jobs that must borrow (as Kueue orders
them: capacity a queue reclaims goes to it, not back to the borrower it was taken from); within
each, a job past its class's maximum wait first (the starvation bound), then higher priority, then,
under DRF, the queue with the smallest weighted dominant share, then the earlier arrival. So the
maximum wait is a promise within the nominal quota; a job that must borrow is promised it only as
far as the lenders do not want their quota back (it may still take from lower-priority borrowers).
A job past its maximum wait that fits its quota but neither the nodes nor any preemption gets a
reservation (`rlsched.policy.reservation`): what it needs, from when the running jobs' walltimes
free it; every later job of the cycle must leave the reservations whole (end before they begin,
or take only what they leave spare), and nothing else is held back (EASY backfill).
Quotas: a job fits its queue if the queue stays within its nominal quota, or borrows the rest from
the idle nominal quota other queues of its cohort lend (within their lending limits and its own
borrowing limit). Placement: every gang by `rlsched.policy.placement.place`; elastic parts (rollout
instances) only where room is left. Preemption, when a job fits its quota but not the nodes: victims
are running jobs that are preemptible, past their minimum run time, and either of lower priority in
the same queue (`within_queue`) or borrowing beyond their own nominal quota while the preemptor's
queue stays within its own (`reclaim_borrowed`); elastic parts go before whole jobs, then the lowest
priority, then the least work lost since the last save. A job never preempts to below a victim
queue's nominal quota, and a reclaim only happens for a queue that will stay within its nominal
quota, so two jobs cannot take capacity from each other in turn (no preemption cycle). A job that
can wait (its queue over quota, or nothing to preempt) gets the blocker in words.

Borrowing within the cohort (`borrow_within_cohort`, Kueue's policy of that name): a job that must
borrow may also take from borrowers of its cohort with a lower priority, so a training gang larger
than its queue's quota does not wait for every preemptible borrower to drain. The reserve
(`reserve`, SPEC section 5): jobs of other classes are placed only if that much still fits on one
node afterwards, less what the reserve's classes use, so an online job that may wait 2 s never
waits for a training job's 30 s grace period. Fairness over history: with `ClusterSnapshot.history`
(each queue's usage decayed by `decay_usage`), DRF orders by that instead of current usage.

Pure: no clock but `now`, nothing mutated.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from rlsched.policy.cluster_model import (
    _EPS,
    AdmissionParams,
    Admit,
    ClusterSnapshot,
    Decision,
    Evict,
    PendingJob,
    RunningJob,
    Wait,
    capacity_of,
    demand,
    dominant_share,
    free_of,
    over,
    quota_check,
    usage_by_queue,
)
from rlsched.policy.cluster_place import place_all, place_elastic
from rlsched.policy.placement import (
    Node,
    Placement,
    Resources,
    Strategy,
    add,
    minus,
)
from rlsched.policy.reservation import (
    Release,
    Reservation,
    bound_by,
    releases_of,
    reserve,
    room,
    take,
    walltime,
)
from rlsched.policy.victims import Candidate, choose_victims, grow

# -- order ------------------------------------------------------------------------------------------


def starving(job: PendingJob, now: float, params: AdmissionParams) -> bool:
    bound = params.classes[job.priority].max_wait_s
    return bound is not None and now - job.submitted >= bound


def order(snapshot: ClusterSnapshot, now: float, params: AdmissionParams) -> list[PendingJob]:
    """Each queue's jobs in their own order (starving first, then priority, then arrival); the queues'
    heads taken in turn as Kueue takes them: a head that fits its queue's nominal quota before one
    that must borrow (the nominal quota is a guarantee: what a queue reclaims goes to it, not back to
    the borrower it took it from), then starving first, then priority, then (DRF) the queue with the
    smallest weighted dominant share, then arrival. Within a queue the order stays, so a
    higher-priority job that borrows is not overtaken by the lower-priority jobs it preempts."""
    cap = capacity_of(snapshot.nodes)
    usage = usage_by_queue(snapshot.running)
    weighed = usage if snapshot.history is None else snapshot.history

    def own(job: PendingJob) -> tuple[bool, int, float, str]:
        return (not starving(job, now, params), -params.classes[job.priority].value, job.submitted, job.name)

    def across(job: PendingJob) -> tuple[bool, bool, int, float, float, str]:
        q = params.queues[job.queue]
        share = dominant_share(weighed.get(job.queue, {}), cap, q.weight) if params.drf else 0.0
        borrows = bool(over(add(usage.get(job.queue, {}), demand(job)), q.nominal))
        return (borrows, *own(job)[:2], share, job.submitted, job.name)

    queues: dict[str, list[PendingJob]] = {}
    for job in sorted(snapshot.pending, key=own, reverse=True):  # each list's head at its end
        queues.setdefault(job.queue, []).append(job)
    heads = [(across(jobs[-1]), q) for q, jobs in queues.items()]
    heapq.heapify(heads)
    out = []
    while heads:
        _, q = heapq.heappop(heads)
        out.append(queues[q].pop())
        if queues[q]:
            heapq.heappush(heads, (across(queues[q][-1]), q))
    return out


# -- placement ----------------------------------------------------------------------------------------


def decay_usage(
    average: Mapping[str, Resources], usage: Mapping[str, Resources], dt: float, half_life_s: float
) -> dict[str, dict[str, float]]:
    """Each queue's usage averaged over the past with weights halving every `half_life_s` (for
    fairness over history: a queue that just used much waits behind one that did not)."""
    keep = 0.5 ** (dt / half_life_s)
    out: dict[str, dict[str, float]] = {}
    for q in {*average, *usage}:
        old, new = average.get(q, {}), usage.get(q, {})
        out[q] = {k: keep * old.get(k, 0.0) + (1 - keep) * new.get(k, 0.0) for k in {*old, *new}}
    return out


def _has_lower(job: PendingJob, snapshot: ClusterSnapshot, params: AdmissionParams) -> bool:
    """Whether a running job that preemption could take quota from has a lower priority: one of its
    queue, or (borrowing within the cohort) one of its cohort."""
    mine = params.classes[job.priority].value
    cohort = params.queues[job.queue].cohort
    for r in snapshot.running:
        if params.classes[r.priority].value >= mine:
            continue
        if params.within_queue and r.queue == job.queue:
            return True
        if params.borrow_within_cohort and cohort is not None and params.queues[r.queue].cohort == cohort:
            return True
    return False


def _leaving(snapshot: ClusterSnapshot) -> list[tuple[str, tuple[tuple[str, Resources], ...]]]:
    """(queue, parts) of what the evictions under way release."""
    out = []
    for job in snapshot.running:
        if job.name in snapshot.evicting:
            parts = job.elastic if snapshot.evicting[job.name] else (*job.allocations, *job.elastic)
            out.append((job.queue, parts))
    return out


def _coming(free: Mapping[str, Resources], snapshot: ClusterSnapshot) -> dict[str, Resources]:
    out = dict(free)
    for _, parts in _leaving(snapshot):
        for node, res in parts:
            if node in out:
                out[node] = add(out[node], res)
    return out


def _usage_coming(usage: Mapping[str, Resources], snapshot: ClusterSnapshot) -> dict[str, dict[str, float]]:
    out = {q: dict(u) for q, u in usage.items()}
    for queue, parts in _leaving(snapshot):
        out[queue] = minus(out.get(queue, {}), add(*(r for _, r in parts)))
    return out


def _after_victims(
    job: PendingJob,
    nodes: Sequence[Node],
    coming: Mapping[str, Resources],
    victims: Sequence[Candidate],
    params: AdmissionParams,
    keep: Resources | None = None,
    able_by_kind: dict[frozenset[str], list[Node]] | None = None,
) -> dict[str, Resources]:
    """What stays free for later jobs once `victims` are gone and `job` has taken its place."""
    after = dict(coming)
    for v in victims:
        for node, res in v.job.elastic if v.elastic_only else (*v.job.allocations, *v.job.elastic):
            if node in after:
                after[node] = add(after[node], res)
    placed = place_all(job, nodes, after, params, keep, able_by_kind)
    return after if isinstance(placed, str) else placed[1]


def _hold(
    free: dict[str, Resources], before: Mapping[str, Resources], after: Mapping[str, Resources]
) -> dict[str, Resources]:
    """Keep what a waiting job was promised (the drop from `before` to `after`, net of the
    releases it waits for) out of what later jobs in this cycle may take: without this, small jobs
    would refill the capacity freed for it and the evictions would never end."""
    out = dict(free)
    for node, was in before.items():
        now = after.get(node, was)
        taken = {k: v - now.get(k, 0.0) for k, v in was.items() if v - now.get(k, 0.0) > 0}
        if taken:
            out[node] = minus(out[node], taken)
    return out


def _reserved_reason(r: Reservation, now: float) -> str:
    nodes = ", ".join(sorted(r.need))
    names = list(r.waits_for[:3]) + ([f"{len(r.waits_for) - 3} more"] if len(r.waits_for) > 3 else [])
    who = (
        f"when {names[0]} is expected to end by its walltime"
        if len(names) == 1
        else f"when {', '.join(names)} are expected to end by their walltimes"
        if names
        else "once the preemptions under way end"
    )
    return (
        f"past its maximum wait: {nodes} reserved for it from {r.start - now:,.0f} s from now, {who}; "
        "jobs that end before then, or fit beside it, start meanwhile"
    )


def _backfill_reason(r: Reservation, now: float) -> str:
    left = r.start - now
    return (
        f"it would run past the start of {r.job}'s reservation (in {left:,.0f} s) on capacity that "
        f"reservation needs; with a walltime under {left:,.0f} s it could start now (backfill)"
    )


def _shape(job: PendingJob, keep: Resources | None) -> tuple[object, ...]:
    gangs = tuple(
        (tuple(tuple(sorted(b.items())) for b in g.bundles), g.strategy, tuple(sorted(g.selector.items())))
        for g in job.gangs
    )
    return (gangs, tuple(sorted((keep or {}).items())))


def _too_big(job: PendingJob, biggest: Mapping[str, float]) -> bool:
    """Whether some bundle, or a STRICT_PACK gang as a whole, asks more than the largest node has."""
    for g in job.gangs:
        wholes = [*g.bundles, g.total()] if g.strategy is Strategy.STRICT_PACK else list(g.bundles)
        if any(v > biggest.get(k, 0.0) + _EPS for b in wholes for k, v in b.items() if v > 0):
            return True
    return False


def _reserve_left(running: Sequence[RunningJob], params: AdmissionParams) -> dict[str, float]:
    """What of the reserve its classes do not use now (what other jobs must leave free)."""
    if not params.reserve:
        return {}
    used = add(*(r.usage() for r in running if r.priority in params.reserve_classes))
    return {k: max(0.0, v - used.get(k, 0.0)) for k, v in params.reserve.items()}


# -- one admission cycle ------------------------------------------------------------------------------------


def admit(snapshot: ClusterSnapshot, now: float, params: AdmissionParams) -> list[Decision]:
    """Decisions for every pending job, in admission order (see the module docstring)."""
    cycle = _Cycle.start(snapshot, now, params)
    for job in order(snapshot, now, params):
        cycle.consider(job)
    every = tuple(range(len(cycle.reservations)))  # an elastic part lives as long as its job
    free = dict(room(cycle.free, cycle.reservations, every))
    cycle.decisions += grow(snapshot, params, free, cycle.usage, cycle.evicting, cycle.reserve)
    return cycle.decisions


_Placed = tuple[list[Placement], dict[str, Resources]] | str  # placements and what is left, or why not


@dataclass(frozen=True)
class _Attempt:
    """One job's try in a cycle: the quota it would borrow (None: over quota), why it would wait,
    the reserve it must leave, and its shape (the key of what already failed in this cycle)."""

    job: PendingJob
    borrowed: dict[str, float] | None
    why: str
    keep: dict[str, float] | None
    shape: tuple[object, ...]
    end: float  # when it is expected to end if it starts now
    bound: tuple[int, ...]  # the reservations it must leave whole (it would run past their start)


@dataclass
class _Cycle:
    """One admission cycle's state. Free only shrinks within a cycle, so a (queue, demand) refused,
    or a shape that did not fit (on what is free now, or once the evictions under way end), is
    refused again later in it without another search."""

    snapshot: ClusterSnapshot
    now: float
    params: AdmissionParams
    free: dict[str, Resources]
    usage: dict[str, dict[str, float]]
    coming: dict[str, Resources]  # what is free once the evictions under way are done
    reserve: dict[str, float]
    usage_later: dict[str, dict[str, float]]  # each queue's usage then, with what is promised
    evicting: set[str]
    empty: dict[str, Resources]  # every node's capacity: the idle cluster
    biggest: dict[str, float]  # per resource, the most any one node has
    waiting: set[str]
    refused: dict[tuple[object, ...], str]
    failed: dict[tuple[object, ...], str]
    failed_later: dict[tuple[object, ...], str]
    never: dict[tuple[object, ...], str]  # shapes that fit not even the empty cluster
    able: dict[frozenset[str], list[Node]]  # nodes that have each set of resources
    decisions: list[Decision]
    reservations: list[Reservation]  # of jobs past their maximum wait, in the order made
    admitted: list[Release]  # what the jobs admitted in this cycle hold, and until when
    running_ends: list[Release] | None = None  # the running jobs' expected ends (made when first needed)
    rooms: dict[tuple[bool, tuple[int, ...]], Mapping[str, Resources]] = field(default_factory=dict)

    @classmethod
    def start(cls, snapshot: ClusterSnapshot, now: float, params: AdmissionParams) -> _Cycle:
        free: dict[str, Resources] = dict(free_of(snapshot.nodes, snapshot.running))
        usage = usage_by_queue(snapshot.running)
        biggest: dict[str, float] = {}
        for n in snapshot.nodes:
            for k, amount in n.capacity.items():
                biggest[k] = max(biggest.get(k, 0.0), amount)
        return cls(
            snapshot=snapshot,
            now=now,
            params=params,
            free=free,
            usage=usage,
            coming=_coming(free, snapshot),
            reserve=_reserve_left(snapshot.running, params),
            usage_later=_usage_coming(usage, snapshot),
            evicting=set(snapshot.evicting),
            empty={n.name: n.capacity for n in snapshot.nodes},
            biggest=biggest,
            waiting={j.name for j in snapshot.pending},
            refused={},
            failed={},
            failed_later={},
            never={},
            able={},
            decisions=[],
            reservations=[],
            admitted=[],
        )

    def consider(self, job: PendingJob) -> None:
        """Admit the job, make room for it, or say why it waits."""
        reason = self._skip(job)
        if reason is not None:
            self.decisions.append(Wait(job.name, reason))
            return
        borrowed, why = quota_check(job, self.params, self.usage)
        if borrowed is None and not (self.evicting or _has_lower(job, self.snapshot, self.params)):
            self.refused[_over_quota_key(job)] = why
        no_reserve = job.priority in self.params.reserve_classes or not any(self.reserve.values())
        keep = None if no_reserve else self.reserve
        end = self.now + walltime(job.priority, job.walltime_s, self.params)
        bound = bound_by(self.reservations, end)
        attempt = _Attempt(job, borrowed, why, keep, (_shape(job, keep), bound), end, bound)
        placed = self._place_now(attempt)
        if isinstance(placed, str):
            attempt = replace(attempt, why=placed)
        elif borrowed is not None:
            self._admit(attempt, placed, borrowed)
            return
        held = self._make_room(attempt)
        if not held and borrowed is not None and starving(job, self.now, self.params):
            self._reserve_for(attempt)  # short of nodes, not of quota: it takes them as they free up

    def _skip(self, job: PendingJob) -> str | None:
        """Why the job waits without a search, or None."""
        if job.yield_to is not None and job.yield_to in self.waiting:
            return f"preempted for {job.yield_to}, which starts first"
        bare = _shape(job, None)
        if bare not in self.never:  # the full check only when a bundle or a packed gang exceeds every node
            fits_empty = (
                place_all(job, self.snapshot.nodes, self.empty, self.params, None, self.able)
                if _too_big(job, self.biggest)
                else ()
            )
            self.never[bare] = fits_empty if isinstance(fits_empty, str) else ""
        if self.never[bare]:  # the real blocker, whatever the quotas say
            return f"it cannot run on this cluster even when idle: {self.never[bare]}"
        return self.refused.get(_over_quota_key(job))  # usage only grows within a cycle

    def _place_now(self, a: _Attempt) -> _Placed:
        """Placed on what is free now, then (a job that would run past a reservation's start) on what
        its reservations leave: one search when it does not fit at all, as most do on a full cluster."""
        if a.borrowed is None:
            return a.why
        alone = (a.shape[0], ())
        if alone in self.failed:
            return self.failed[alone]
        if a.shape in self.failed:
            return self.failed[a.shape]
        placed = place_all(a.job, self.snapshot.nodes, self.free, self.params, a.keep, self.able)
        if isinstance(placed, str):
            self.failed[alone] = placed
            return placed
        if not a.bound:
            return placed
        placed = place_all(a.job, self.snapshot.nodes, self._room(a.bound), self.params, a.keep, self.able)
        if isinstance(placed, str):  # it fits: only a reservation stands in its way
            first = min((self.reservations[i] for i in a.bound), key=lambda r: r.start)
            placed = self.failed[a.shape] = _backfill_reason(first, self.now)
        return placed

    def _room(self, bound: tuple[int, ...], coming: bool = False) -> Mapping[str, Resources]:
        """What is free now (or once the evictions under way end) less what `bound`'s reservations
        need; kept until the cycle next takes or promises capacity."""
        key = (coming, bound)
        if key not in self.rooms:
            self.rooms[key] = room(self.coming if coming else self.free, self.reservations, bound)
        return self.rooms[key]

    def _admit(
        self,
        a: _Attempt,
        placed: tuple[list[Placement], dict[str, Resources]],
        borrowed: dict[str, float],
    ) -> None:
        job = a.job
        placements, left = placed
        elastic_nodes = place_elastic(job.elastic, left)  # on what its reservations leave, too
        taken = [
            (n, b)
            for g, pl in zip(job.gangs, placements, strict=True)
            for b, n in zip(g.bundles, pl.nodes, strict=True)
        ]
        parts = (*taken, *zip(elastic_nodes, job.elastic, strict=False))
        for node, res in parts:
            self.free[node] = minus(self.free[node], res)
            self.coming[node] = minus(self.coming[node], res)
        take(self.reservations, a.bound, parts)
        self.rooms.clear()
        self.admitted.append(Release(a.end, job.name, parts))
        used = (demand(job), *job.elastic[: len(elastic_nodes)])
        self.usage[job.queue] = add(self.usage.get(job.queue, {}), *used)
        self.usage_later[job.queue] = add(self.usage_later.get(job.queue, {}), *used)
        if job.priority in self.params.reserve_classes and self.reserve:
            self.reserve = {k: max(0.0, v - add(*used).get(k, 0.0)) for k, v in self.reserve.items()}
        self.decisions.append(Admit(job.name, tuple(placements), tuple(elastic_nodes), borrowed))

    def _make_room(self, a: _Attempt) -> bool:
        """It does not fit now: wait for the evictions under way, or start new ones (the victims).
        Whether capacity is now held for it."""
        job = a.job
        quota_later = a.borrowed is not None or quota_check(job, self.params, self.usage_later)[0] is not None
        coming = self._room(a.bound, coming=True)
        if not quota_later:
            later: _Placed = a.why
        elif not (self.snapshot.evicting or self.evicting) or a.shape in self.failed_later:
            later = self.failed_later.get(a.shape, a.why)  # nothing is being freed: `coming` is `free`
        else:
            later = place_all(job, self.snapshot.nodes, coming, self.params, a.keep, self.able)
            if isinstance(later, str):
                self.failed_later[a.shape] = later
        if not isinstance(later, str):  # the evictions already under way make room for it
            self._promise(a, coming, later[1])
            self.usage_later[job.queue] = add(self.usage_later.get(job.queue, {}), demand(job))
            self.decisions.append(Wait(job.name, "waiting for the preemptions under way to finish"))
            return True
        return self._preempt(a, coming)

    def _promise(self, a: _Attempt, before: Mapping[str, Resources], after: Mapping[str, Resources]) -> None:
        """Hold for a waiting job what it will take once the releases it waits for come (the drop
        from `before` to `after`), in what is free now and what will be."""
        self.rooms.clear()
        self.free = _hold(self.free, before, after)
        # what its reservations kept out of `before` stays coming for the jobs that end before them
        self.coming = {n: add(after[n], minus(self.coming[n], before[n])) if n in after else r
                       for n, r in self.coming.items()}  # fmt: skip
        if a.bound:
            held = tuple((n, minus(before[n], after[n])) for n in before if n in after)
            take(
                self.reservations, a.bound, tuple((n, {k: v for k, v in r.items() if v > 0}) for n, r in held)
            )

    def _preempt(self, a: _Attempt, coming: Mapping[str, Resources]) -> bool:
        job = a.job
        running = tuple(r for r in self.snapshot.running if r.name not in self.evicting)
        if a.bound:  # a victim must still be running when its reservations begin: they count on the rest
            last = max(self.reservations[i].start for i in a.bound)
            over = {r.job for r in self._running_ends() if r.at > last}
            running = tuple(r for r in running if r.name in over)
        victims = choose_victims(
            job,
            ClusterSnapshot(self.snapshot.nodes, running, ()),
            self.now,
            self.params,
            coming,
            self.usage_later,
            a.keep,
            self.able,
        )
        if victims is None:
            self.decisions.append(Wait(job.name, a.why))
            return False
        after = _after_victims(job, self.snapshot.nodes, coming, victims, self.params, a.keep, self.able)
        self._promise(a, coming, after)
        self.usage_later[job.queue] = add(self.usage_later.get(job.queue, {}), demand(job))
        for v in victims:
            released = v.job.elastic if v.elastic_only else (*v.job.allocations, *v.job.elastic)
            self.usage_later[v.job.queue] = minus(
                self.usage_later[v.job.queue], add(*(r for _, r in released))
            )
            self.evicting.add(v.job.name)
            grace = self.params.classes[v.job.priority].grace_s
            self.decisions.append(Evict(v.job.name, v.elastic_only, grace, job.name, v.why))
        longest = max(self.params.classes[v.job.priority].grace_s for v in victims)
        self.decisions.append(
            Wait(job.name, f"{len(victims)} preemption(s) under way (grace up to {longest:g} s)")
        )
        return True

    def _running_ends(self) -> list[Release]:
        if self.running_ends is None:
            self.running_ends = releases_of(self.snapshot.running, self.now, self.params)
        return self.running_ends

    def _reserve_for(self, a: _Attempt) -> None:
        """A job past its maximum wait that neither fits nor can make room now: the earliest
        reservation on what the running jobs (and those admitted in this cycle) will release; its
        reason replaces the wait's."""
        job = a.job
        if len(self.reservations) >= self.params.max_reservations:
            last = self.decisions[-1]
            assert isinstance(last, Wait)
            held = f"{len(self.reservations)} jobs past their maximum wait hold reservations ahead of it"
            self.decisions[-1] = Wait(job.name, f"{last.reason}; {held}")
            return
        releases = [r for r in (*self._running_ends(), *self.admitted) if r.job not in self.evicting]
        got = reserve(
            job.name,
            walltime(job.priority, job.walltime_s, self.params),
            [g.bundles for g in job.gangs],
            lambda free: place_all(job, self.snapshot.nodes, free, self.params, a.keep, self.able),
            self.coming,
            releases,
            self.reservations,
            self.now,
        )
        if got is None:
            return  # not even every release would do: its wait's reason stands
        self.reservations.append(got)
        self.decisions[-1] = Wait(job.name, _reserved_reason(got, self.now), got.start)


def _over_quota_key(job: PendingJob) -> tuple[object, ...]:
    return (job.queue, tuple(sorted(demand(job).items())))

"""Admission of jobs to a shared cluster: order, quotas and borrowing, placement, victims, starvation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.admission import admit, decay_usage, order, starving
from rlsched.policy.cluster_model import (
    AdmissionParams,
    Admit,
    ClassParams,
    ClusterSnapshot,
    Evict,
    Grow,
    PendingJob,
    QueueParams,
    RunningJob,
    Wait,
    demand,
    free_of,
    over,
    usage_by_queue,
)
from rlsched.policy.cluster_place import place_all
from rlsched.policy.placement import Gang, Node, Strategy, add, fits
from rlsched.policy.reservation import expected_end, walltime

CLASSES = {
    "online": ClassParams(1000, preemptible=False, max_wait_s=2),
    "training": ClassParams(100, grace_s=30, min_run_s=60, max_wait_s=3600),
    "batch": ClassParams(10, grace_s=10, min_run_s=0, max_wait_s=600),
}


def params(**queues: QueueParams) -> AdmissionParams:
    return AdmissionParams(CLASSES, queues, device_types=frozenset({"H100", "A100"}))


def gang(
    gpus: float, cpus: float = 4, n: int = 1, device: str = "GPU", strategy: Strategy = Strategy.STRICT_PACK
) -> Gang:
    return Gang(tuple({device: gpus, "CPU": cpus} for _ in range(n)), strategy)


NODES = (Node("n1", {"GPU": 8, "CPU": 32}), Node("n2", {"GPU": 8, "CPU": 32}))


def by_job(decisions: list) -> dict[str, object]:
    return {d.job: d for d in decisions if not isinstance(d, Evict)}


def test_higher_priority_goes_first_and_the_rest_waits_with_the_blocker() -> None:
    p = params(a=QueueParams(nominal={"GPU": 32, "CPU": 128}))  # quota enough: the nodes are not
    low = PendingJob("low", "a", "batch", 0.0, (gang(8),))
    high = PendingJob("high", "a", "training", 5.0, (gang(8), gang(8)))
    got = by_job(admit(ClusterSnapshot(NODES, (), (low, high)), 10.0, p))
    assert isinstance(got["high"], Admit) and isinstance(got["low"], Wait)
    assert "needs 8 GPU and 4 CPU on one node" in got["low"].reason


def test_a_queue_over_its_quota_without_a_cohort_waits_and_says_so() -> None:
    p = params(a=QueueParams(nominal={"GPU": 4, "CPU": 64}))
    got = admit(ClusterSnapshot(NODES, (), (PendingJob("j", "a", "batch", 0.0, (gang(8),)),)), 1.0, p)
    assert got == [
        Wait(
            "j",
            "queue a would use 8 GPU with this job, over its nominal quota of 4 GPU, "
            "and it has no cohort to borrow from",
        )
    ]


def test_borrowing_within_a_cohort_respects_lending_limits() -> None:
    p = params(
        a=QueueParams(cohort="c", nominal={"GPU": 4, "CPU": 32}),
        b=QueueParams(cohort="c", nominal={"GPU": 12, "CPU": 32}, lending_limit={"GPU": 6, "CPU": 32}),
    )
    fits_loan = PendingJob("j1", "a", "batch", 0.0, (gang(8),))
    (d,) = admit(ClusterSnapshot(NODES, (), (fits_loan,)), 1.0, p)
    assert isinstance(d, Admit) and d.borrowed == {"GPU": 4}
    too_much = PendingJob("j2", "a", "batch", 0.0, (gang(8), gang(4, n=1)))
    (w,) = admit(ClusterSnapshot(NODES, (), (too_much,)), 1.0, p)
    assert isinstance(w, Wait) and "cohort c has 6 GPU to lend" in w.reason


def test_a_queue_reclaims_its_lent_quota_elastic_parts_first() -> None:
    p = params(
        a=QueueParams(cohort="c", nominal={"GPU": 8, "CPU": 32}),
        b=QueueParams(cohort="c", nominal={"GPU": 8, "CPU": 32}),
    )
    borrower = RunningJob(
        "b-job", "b", "training", 0.0,
        allocations=(("n1", {"GPU": 8, "CPU": 4}),),
        elastic=(("n2", {"GPU": 4, "CPU": 2}), ("n2", {"GPU": 4, "CPU": 2})),
    )  # fmt: skip
    owner = PendingJob("a-job", "a", "batch", 100.0, (gang(8),))
    got = admit(ClusterSnapshot(NODES, (borrower,), (owner,)), 200.0, p)
    evicts = [d for d in got if isinstance(d, Evict)]
    assert evicts == [
        Evict("b-job", True, 30.0, "a-job", "queue b borrows beyond its nominal quota and a reclaims it")
    ]
    assert isinstance(by_job(got)["a-job"], Wait) and "preemption(s) under way" in by_job(got)["a-job"].reason


def test_a_job_that_must_borrow_takes_from_lower_priority_borrowers_of_its_cohort() -> None:
    """Kueue's borrowWithinCohort: a training gang larger than its queue's nominal quota would otherwise
    wait for every preemptible borrower to drain (past its maximum wait on a busy cluster)."""
    p = params(
        team=QueueParams(cohort="c", nominal={"GPU": 8, "CPU": 32}),
        spot=QueueParams(cohort="c", nominal={}),
        idle=QueueParams(cohort="c", nominal={"GPU": 8, "CPU": 32}),
    )
    spot = RunningJob("spot-1", "spot", "batch", 0.0, (("n2", {"GPU": 8, "CPU": 4}),))
    gang16 = PendingJob("big", "team", "training", 50.0, (gang(8, n=2, strategy=Strategy.STRICT_SPREAD),))
    got = admit(ClusterSnapshot(NODES, (spot,), (gang16,)), 100.0, p)
    assert [d for d in got if isinstance(d, Evict)] == [
        Evict("spot-1", False, 10.0, "big", "lower priority (batch) borrowing in cohort c")
    ]
    off = AdmissionParams(CLASSES, p.queues, borrow_within_cohort=False)
    assert not [
        d for d in admit(ClusterSnapshot(NODES, (spot,), (gang16,)), 100.0, off) if isinstance(d, Evict)
    ]


def test_the_reserve_stays_free_for_its_classes() -> None:
    """SPEC section 5: online work that may wait 2 s is served from a reserve, not by preemption."""
    base = params(a=QueueParams(nominal={"GPU": 16, "CPU": 64}))
    p = AdmissionParams(
        CLASSES, base.queues, reserve={"GPU": 2, "CPU": 4}, reserve_classes=frozenset({"online"})
    )
    batch = [PendingJob(f"b{i}", "a", "batch", float(i), (gang(4),)) for i in range(4)]
    got = by_job(admit(ClusterSnapshot(NODES, (), tuple(batch)), 1.0, p))
    assert [isinstance(got[f"b{i}"], Admit) for i in range(4)] == [True, True, True, False]
    assert "capacity reserved for online (2 GPU, 4 CPU kept free on one node)" in got["b3"].reason
    online = PendingJob("serve", "a", "online", 0.5, (gang(2),))
    got = by_job(admit(ClusterSnapshot(NODES, (), (*batch, online)), 1.0, p))
    assert isinstance(got["serve"], Admit)  # it goes first and takes the reserve
    assert sum(isinstance(got[f"b{i}"], Admit) for i in range(4)) == 3


def test_fairness_over_history_puts_the_queue_that_used_more_behind() -> None:
    p = params(
        a=QueueParams(cohort="c", nominal={"GPU": 8, "CPU": 32}),
        b=QueueParams(cohort="c", nominal={"GPU": 8, "CPU": 32}),
    )
    ja, jb = PendingJob("ja", "a", "batch", 0.0, (gang(4),)), PendingJob("jb", "b", "batch", 1.0, (gang(4),))
    now = ClusterSnapshot(NODES, (), (ja, jb))
    assert [j.name for j in order(now, 2.0, p)] == ["ja", "jb"]  # nothing runs: arrival decides
    history = decay_usage({}, {"a": {"GPU": 16.0}}, dt=600.0, half_life_s=600.0)
    assert history["a"]["GPU"] == 8.0  # half of what a used over one half-life
    past = ClusterSnapshot(NODES, (), (ja, jb), history=history)
    assert [j.name for j in order(past, 2.0, p)] == ["jb", "ja"]


def test_limits_that_name_some_resources_leave_the_others_unlimited() -> None:
    p = params(
        a=QueueParams(cohort="c", nominal={"GPU": 4, "CPU": 4}, borrowing_limit={"GPU": 8}),
        b=QueueParams(cohort="c", nominal={"GPU": 12, "CPU": 60}, lending_limit={"GPU": 12}),
    )
    (d,) = admit(
        ClusterSnapshot(NODES, (), (PendingJob("j", "a", "batch", 0.0, (gang(8, cpus=20),)),)), 1.0, p
    )
    assert isinstance(d, Admit) and d.borrowed == {"GPU": 4, "CPU": 16}


def test_elastic_parts_come_back_when_there_is_room_and_not_before_the_pending_jobs() -> None:
    p = params(a=QueueParams(nominal={"GPU": 16, "CPU": 64}))
    part = {"GPU": 4.0, "CPU": 2.0}
    job = RunningJob("rl", "a", "batch", 0.0, (("n1", {"GPU": 8, "CPU": 4}),), missing=(part, part, part))
    got = admit(ClusterSnapshot(NODES, (job,), ()), 10.0, p)
    assert got == [Grow("rl", ("n2", "n2"))]  # two fit; the third waits for room
    waiting = PendingJob("big", "a", "training", 5.0, (gang(8),))
    got = admit(ClusterSnapshot(NODES, (job,), (waiting,)), 10.0, p)
    assert isinstance(got[0], Admit) and got[1:] == []  # the pending job first: nothing left


def test_minimum_run_time_and_non_preemptible_classes_are_never_victims() -> None:
    p = params(a=QueueParams(nominal={"GPU": 16, "CPU": 64}))
    young = RunningJob(
        "young", "a", "training", 90.0, (("n1", {"GPU": 8, "CPU": 4}), ("n2", {"GPU": 8, "CPU": 4}))
    )
    online = PendingJob("urgent", "a", "online", 100.0, (gang(8),))
    got = admit(ClusterSnapshot(NODES, (young,), (online,)), 100.0, p)  # young has run 10 s of its 60
    assert not [d for d in got if isinstance(d, Evict)] and isinstance(by_job(got)["urgent"], Wait)
    later = admit(ClusterSnapshot(NODES, (young,), (online,)), 200.0, p)
    assert [d.job for d in later if isinstance(d, Evict)] == ["young"]


def test_a_job_past_its_maximum_wait_goes_first_and_holds_what_it_needs() -> None:
    p = params(a=QueueParams(nominal={"GPU": 16, "CPU": 64}))
    old = PendingJob("old-batch", "a", "batch", 0.0, (gang(8, n=2, strategy=Strategy.STRICT_SPREAD),))
    new = PendingJob("new-training", "a", "training", 650.0, (gang(8),))
    snap = ClusterSnapshot(NODES, (), (new, old))
    assert [j.name for j in order(snap, 100.0, p)] == ["new-training", "old-batch"]
    assert [j.name for j in order(snap, 700.0, p)] == ["old-batch", "new-training"]  # waited 700 s > 600
    got = by_job(admit(snap, 700.0, p))
    assert isinstance(got["old-batch"], Admit) and isinstance(got["new-training"], Wait)


def test_a_device_type_no_node_has_is_a_pending_reason_not_a_hang() -> None:
    p = params(a=QueueParams(nominal={"B200": 8, "CPU": 64, "GPU": 16}))
    job = PendingJob("j", "a", "batch", 0.0, (gang(4, device="B200"),))
    (w,) = admit(ClusterSnapshot(NODES, (), (job,)), 1.0, p)
    assert isinstance(w, Wait) and "no node has B200" in w.reason


# -- properties over random clusters and job sets ---------------------------------------------------------

QUEUE_NAMES = ("a", "b", "c")
CLASS_NAMES = tuple(CLASSES)


def random_gang(draw: st.DrawFn, max_gpus: int, max_bundles: int) -> Gang:
    n = draw(st.integers(1, max_bundles))
    bundles = tuple({"GPU": float(draw(st.integers(0, max_gpus))), "CPU": 2.0} for _ in range(n))
    return Gang(bundles, draw(st.sampled_from(list(Strategy))))


# None: the class's default; 50 s: a running job started earlier has overrun it
WALLTIMES = st.sampled_from([None, 50.0, 2000.0, 20000.0])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[ClusterSnapshot, AdmissionParams, float]:
    nodes = tuple(
        Node(f"n{i}", {"GPU": float(draw(st.integers(0, 8))), "CPU": float(draw(st.integers(4, 32)))})
        for i in range(draw(st.integers(1, 4)))
    )
    cap = add(*(n.capacity for n in nodes))
    shares = [draw(st.integers(0, 3)) for _ in QUEUE_NAMES]
    total = sum(shares) or 1
    queues = {
        q: QueueParams(
            cohort=draw(st.sampled_from([None, "c1"])),
            weight=float(draw(st.integers(1, 3))),
            nominal={k: v * s / total for k, v in cap.items()},
            borrowing_limit=draw(st.sampled_from([None, {"GPU": 2.0, "CPU": 8.0}])),
            lending_limit=draw(st.sampled_from([None, {"GPU": 4.0, "CPU": 8.0}])),
        )
        for q, s in zip(QUEUE_NAMES, shares, strict=True)
    }
    p = AdmissionParams(CLASSES, queues)
    now = 1000.0
    # running jobs: admitted by the policy itself from an empty cluster, so they are consistent
    seeds = [
        PendingJob(
            f"r{i}", draw(st.sampled_from(QUEUE_NAMES)), draw(st.sampled_from(CLASS_NAMES)), 0.0,
            (random_gang(draw, max_gpus=4, max_bundles=2),),
            tuple({"GPU": 1.0, "CPU": 1.0} for _ in range(draw(st.integers(0, 2)))),
        )
        for i in range(draw(st.integers(0, 5)))
    ]  # fmt: skip
    running = []
    for d in admit(ClusterSnapshot(nodes, (), tuple(seeds)), 0.0, p):
        if isinstance(d, Admit):
            job = next(s for s in seeds if s.name == d.job)
            allocs = tuple(
                (node, b)
                for g, pl in zip(job.gangs, d.placements, strict=True)
                for b, node in zip(g.bundles, pl.nodes, strict=True)
            )
            elastic = tuple(zip(d.elastic_nodes, job.elastic, strict=False))
            started = float(draw(st.integers(0, 990)))
            wall = draw(WALLTIMES)
            running.append(
                RunningJob(job.name, job.queue, job.priority, started, allocs, elastic, walltime_s=wall)
            )
    pending = tuple(
        PendingJob(
            f"p{i}", draw(st.sampled_from(QUEUE_NAMES)), draw(st.sampled_from(CLASS_NAMES)),
            float(draw(st.integers(0, 999))),
            (random_gang(draw, max_gpus=8, max_bundles=3),),
            walltime_s=draw(WALLTIMES),
        )
        for i in range(draw(st.integers(1, 5)))
    )  # fmt: skip
    return ClusterSnapshot(nodes, tuple(running), pending), p, now


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_admission_never_over_commits_keeps_gangs_whole_and_respects_quotas(world: tuple) -> None:
    snap, p, now = world
    decisions = admit(snap, now, p)
    free = free_of(snap.nodes, snap.running)
    usage = usage_by_queue(snap.running)
    pending = {j.name: j for j in snap.pending}
    assert {d.job for d in decisions if not isinstance(d, Evict)} == set(pending)  # every job answered
    for d in decisions:
        if not isinstance(d, Admit):
            continue
        job = pending[d.job]
        assert len(d.placements) == len(job.gangs)
        for g, pl in zip(job.gangs, d.placements, strict=True):
            assert len(pl.nodes) == len(g.bundles)  # all or nothing
            for b, node in zip(g.bundles, pl.nodes, strict=True):
                free[node] = {k: free[node].get(k, 0.0) - b.get(k, 0.0) for k in set(free[node]) | set(b)}
        for part, node in zip(job.elastic, d.elastic_nodes, strict=False):
            free[node] = {k: free[node].get(k, 0.0) - part.get(k, 0.0) for k in set(free[node]) | set(part)}
        usage[job.queue] = add(usage.get(job.queue, {}), demand(job), *job.elastic[: len(d.elastic_nodes)])
        q = p.queues[job.queue]
        extra = over(usage[job.queue], q.nominal)
        if q.borrowing_limit is not None:
            assert all(v <= q.borrowing_limit.get(k, 0.0) + 1e-6 for k, v in extra.items())
        assert not extra or q.cohort is not None
    assert all(v >= -1e-6 for f in free.values() for v in f.values())  # never over-committed


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_victims_are_eligible_and_nothing_admitted_delays_a_reservation(world: tuple) -> None:
    snap, p, now = world
    decisions = admit(snap, now, p)
    running = {r.name: r for r in snap.running}
    pending = {j.name: j for j in snap.pending}
    usage = usage_by_queue(snap.running)
    for d in decisions:
        if isinstance(d, Evict):
            v, j = running[d.job], pending[d.for_job]
            cls = p.classes[v.priority]
            assert cls.preemptible and now - v.started >= cls.min_run_s
            same_queue_lower = v.queue == j.queue and cls.value < p.classes[j.priority].value
            reclaimed = bool(over(usage.get(v.queue, {}), p.queues[v.queue].nominal))
            assert same_queue_lower or reclaimed
    ordered = order(snap, now, p)
    assert sorted(j.name for j in ordered) == sorted(pending)
    for q in QUEUE_NAMES:  # within a queue: every starving job first, then by priority
        mine = [(not starving(j, now, p), -p.classes[j.priority].value) for j in ordered if j.queue == q]
        assert mine == sorted(mine)
    reserved = [d for d in decisions if isinstance(d, Wait) and d.reserved_from is not None]
    assert all(starving(pending[d.job], now, p) and d.reserved_from >= now for d in reserved)
    if reserved and not any(isinstance(d, Evict) for d in decisions):
        # at the first reservation's start, on what is free then, the job fits, whatever was admitted
        first, start = pending[reserved[0].job], reserved[0].reserved_from
        assert fits_at(start, first, snap, decisions, now, p), (reserved[0], decisions)


def fits_at(
    t: float, job: PendingJob, snap: ClusterSnapshot, decisions: list, now: float, p: AdmissionParams
) -> bool:
    """Whether `job` can be placed at `t` on what the running and just-admitted jobs leave then, each
    gone if it is expected to have ended by `t`."""
    free = {n.name: dict(n.capacity) for n in snap.nodes}
    holders = [(expected_end(r.started, walltime(r.priority, r.walltime_s, p), now, p.overrun_grace_s),
                (*r.allocations, *r.elastic)) for r in snap.running]  # fmt: skip
    pending = {j.name: j for j in snap.pending}
    for d in decisions:
        if isinstance(d, Admit):
            a = pending[d.job]
            parts = [(n, b) for g, pl in zip(a.gangs, d.placements, strict=True)
                     for b, n in zip(g.bundles, pl.nodes, strict=True)]  # fmt: skip
            parts += list(zip(d.elastic_nodes, a.elastic, strict=False))
            holders.append((now + walltime(a.priority, a.walltime_s, p), tuple(parts)))
    for end, parts in holders:
        if end > t:
            for node, res in parts:
                free[node] = {k: free[node].get(k, 0.0) - res.get(k, 0.0) for k in set(free[node]) | set(res)}
    return not isinstance(place_all(job, snap.nodes, free, p), str)


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_no_preemption_cycle(world: tuple) -> None:
    """If A evicts B, then once A runs and B waits again, B never evicts A."""
    snap, p, now = world
    first = admit(snap, now, p)
    evicts = [d for d in first if isinstance(d, Evict) and not d.elastic_only]
    pending = {j.name: j for j in snap.pending}
    for e in evicts:
        victim = next(r for r in snap.running if r.name == e.job)
        preemptor = pending[e.for_job]
        rest = tuple(r for r in snap.running if r.name not in {x.job for x in evicts})
        placed = admit(ClusterSnapshot(snap.nodes, rest, (preemptor,)), now, p)
        admitted = next((d for d in placed if isinstance(d, Admit)), None)
        if admitted is None:
            continue
        allocs = tuple(
            (node, b) for g, pl in zip(preemptor.gangs, admitted.placements, strict=True)
            for b, node in zip(g.bundles, pl.nodes, strict=True)
        )  # fmt: skip
        now2 = now + 10_000.0  # long after: minimum run times no longer protect anyone
        as_running = RunningJob(preemptor.name, preemptor.queue, preemptor.priority, now, allocs)
        back = PendingJob(
            victim.name,
            victim.queue,
            victim.priority,
            now,
            (Gang(tuple(r for _, r in victim.allocations), Strategy.PACK),),
        )
        again = admit(ClusterSnapshot(snap.nodes, (*rest, as_running), (back,)), now2, p)
        assert not any(isinstance(d, Evict) and d.job == preemptor.name for d in again)


def test_fits_helper_sanity() -> None:
    assert fits({"GPU": 1}, {"GPU": 1.0}) and not fits({"GPU": 2}, {"GPU": 1})

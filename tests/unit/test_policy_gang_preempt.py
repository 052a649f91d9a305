"""Gang verifications (all or none, EASY backfilling) and preemption of deferrable work, in `decide`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import (
    BatchId,
    BatchState,
    Dispatch,
    DispatchPolicy,
    PendingVerification,
    Preempt,
    RunningVerification,
    TaskId,
    VerifyParams,
    VerifySnapshot,
    Wait,
    WorkerId,
    WorkerSlot,
    decide,
)


def estimator(**history: list[float]) -> RemainingTime:
    est = RemainingTime()
    for key, times in history.items():
        for t in times:
            est.observe("k", key, t)
    return est


def task(tid: str, key: str, arrival: float = 0.0, slots: int = 1, batch: str = "b") -> PendingVerification:
    return PendingVerification(TaskId(tid), BatchId(batch), arrival, kind="k", key=key, slots=slots)


def running(
    tid: str, key: str, started: float, worker: str, batch: str = "b", attempt: int = 0
) -> RunningVerification:
    return RunningVerification(
        TaskId(tid), BatchId(batch), started, "k", key, worker_id=WorkerId(worker), attempt=attempt
    )


def free(*names: str) -> tuple[WorkerSlot, ...]:
    return tuple(WorkerSlot(WorkerId(n)) for n in names)


FIFO = VerifyParams(DispatchPolicy.FIFO)


def test_a_gang_starts_only_with_all_its_workers() -> None:
    snap = VerifySnapshot((task("g", "g", slots=3),), free("w0", "w1", "w2"), pool_size=3)
    assert decide(snap, 0.0, FIFO) == (
        Dispatch(TaskId("g"), WorkerId("w0"), (WorkerId("w1"), WorkerId("w2"))),
    )


def test_a_gang_that_does_not_fit_holds_the_free_workers_except_for_work_that_ends_in_time() -> None:
    est = estimator(g=[10.0] * 3, short=[1.0] * 3, long=[50.0] * 3, busy=[5.0] * 3)
    snap = VerifySnapshot(
        (task("g", "g", 0.0, slots=3), task("short", "short", 1.0), task("long", "long", 2.0)),
        free("w0", "w1"),
        running=(running("r", "busy", 0.0, "w2"),),  # expected to end at 5 s: the gang's shadow time
        estimator=est,
        pool_size=3,
    )
    out = decide(snap, 0.0, FIFO)
    assert Dispatch(TaskId("short"), WorkerId("w0")) in out  # ends by 1 s, before the gang can start
    (wait,) = [d for d in out if isinstance(d, Wait)]
    assert set(wait.task_ids) == {TaskId("g"), TaskId("long")}  # 50 s would delay the gang
    assert "needs 3 workers at once" in wait.reason


def test_a_gang_larger_than_the_pool_says_so_and_blocks_nothing() -> None:
    snap = VerifySnapshot((task("g", "g", 0.0, slots=5), task("a", "a", 1.0)), free("w0", "w1"), pool_size=2)
    out = decide(snap, 0.0, FIFO)
    assert Dispatch(TaskId("a"), WorkerId("w0")) in out
    assert Wait((TaskId("g"),), "needs 5 workers at once; the pool has 2") in out


def _two_batches(preempt: bool, attempt: int = 0) -> tuple[Preempt | Dispatch | Wait, ...]:
    est = estimator(urgent=[30.0] * 3, cheap=[5.0] * 3)
    snap = VerifySnapshot(
        (task("u", "urgent", 9.0, batch="big"),),
        (WorkerSlot(WorkerId("w0"), TaskId("c")),),
        running=(running("c", "cheap", 9.0, "w0", batch="small", attempt=attempt),),
        batches=(
            BatchState(BatchId("big"), cost_rate=64.0),
            BatchState(BatchId("small"), cost_rate=1.0, outstanding=1, generation_end=100.0),
        ),
        estimator=est,
        pool_size=1,
    )
    return decide(snap, 10.0, VerifyParams(DispatchPolicy.DISTRS, preempt=preempt))


def test_urgent_work_preempts_deferrable_work_of_a_cheaper_batch() -> None:
    out = _two_batches(preempt=True)
    (p,) = [d for d in out if isinstance(d, Preempt)]
    assert (p.task_id, p.worker_id, p.for_task) == (TaskId("c"), WorkerId("w0"), TaskId("u"))
    assert not [d for d in _two_batches(preempt=False) if isinstance(d, Preempt)]


def test_a_run_preempted_once_is_not_preempted_again() -> None:
    assert not [d for d in _two_batches(preempt=True, attempt=1) if isinstance(d, Preempt)]


@settings(max_examples=300, deadline=None)
@given(
    slots=st.lists(st.integers(1, 4), min_size=1, max_size=12),
    n_free=st.integers(0, 6),
    n_busy=st.integers(0, 4),
    policy=st.sampled_from(list(DispatchPolicy)),
)
def test_no_worker_is_given_twice_and_gangs_get_exactly_their_slots(
    slots: list[int], n_free: int, n_busy: int, policy: DispatchPolicy
) -> None:
    pend = tuple(task(f"t{i}", f"p{i % 3}", float(i), slots=s) for i, s in enumerate(slots))
    workers = free(*(f"w{i}" for i in range(n_free))) + tuple(
        WorkerSlot(WorkerId(f"b{i}"), TaskId(f"r{i}")) for i in range(n_busy)
    )
    run = tuple(running(f"r{i}", "p0", 0.0, f"b{i}") for i in range(n_busy))
    snap = VerifySnapshot(pend, workers, running=run, estimator=estimator(p0=[1.0, 2.0], p1=[3.0]))
    out = decide(snap, 1.0, VerifyParams(policy))
    given_out = [w for d in out if isinstance(d, Dispatch) for w in (d.worker_id, *d.gang)]
    assert len(given_out) == len(set(given_out)) and set(given_out) <= {f"w{i}" for i in range(n_free)}
    by_id = {p.task_id: p for p in pend}
    for d in out:
        if isinstance(d, Dispatch):
            assert 1 + len(d.gang) == by_id[d.task_id].slots
    decided = [d.task_id for d in out if isinstance(d, Dispatch)] + [
        t for d in out if isinstance(d, Wait) for t in d.task_ids
    ]
    assert sorted(decided) == sorted(by_id)  # every pending verification is dispatched or waits, once

"""The verifier pool's core on its own: events in, effects out, every rule the drivers rely on.

No Ray and no simulator: each test plays the driver by hand, so what the core decides is visible
effect by effect (the Ray pool's tests and the simulator's run the same core under real drivers).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlsched.core.verify_pool import VerifyPoolCore
from rlsched.core.verify_pool_io import (
    AskHeartbeat,
    Effect,
    HandedOn,
    HeartbeatAnswered,
    Heartbeats,
    PoolParams,
    RunEnded,
    RunFinished,
    Settled,
    StartRun,
    StartWorker,
    StopReason,
    StopWorker,
    Submitted,
    Tick,
    WorkerExited,
    WorkerUp,
)
from rlsched.policy.lifecycle import IllegalTransition, SlotState
from rlsched.policy.timeouts import TimeoutParams
from rlsched.policy.verify import BatchId, PendingVerification, TaskId, WorkerId
from verifiers.protocol import ExecutionFault, FaultKind, Prepared, Verdict

TIMEOUTS = TimeoutParams(floor_s=1.0, factor=1.5, cap_s=10.0, hard_cap_s=20.0)


def core(workers: int = 1, **params: object) -> VerifyPoolCore:
    """A core whose first workers are up at t=0."""
    c = VerifyPoolCore(PoolParams(workers=workers, timeouts=TIMEOUTS, **params))  # type: ignore[arg-type]
    for effect in c.start():
        assert isinstance(effect, StartWorker)
        c.handle(WorkerUp(0.0, effect.worker))
    return c


def task(n: int, at: float = 0.0, slots: int = 1) -> PendingVerification:
    return PendingVerification(TaskId(f"t{n}"), BatchId("b"), at, key=f"p{n}", slots=slots)


def only(effects: list[Effect], kind: type) -> list[Effect]:
    return [e for e in effects if isinstance(e, kind)]


def passed(t: PendingVerification, at: float, took: float = 1.0) -> RunFinished:
    return RunFinished(at, t.task_id, t.attempt, Verdict(t.task_id, 1.0, True), at - took, at)


def test_a_submitted_task_runs_on_a_free_worker_and_its_verdict_is_settled() -> None:
    c = core()
    t = task(0)
    (start,) = c.handle(Submitted(0.0, (t,)))
    assert isinstance(start, StartRun) and start.task == t and start.timeout_s == TIMEOUTS.cap_s
    ended, settled = c.handle(passed(t, 2.0, took=2.0))
    assert isinstance(ended, RunEnded) and ended.outcome == "Verdict" and ended.free_at_arrival
    assert settled == Settled(t.task_id, Verdict(t.task_id, 1.0, True))
    assert c.idle and c.timeouts.timeout("default/p0") == 3.0  # 1.5 x the correct run's 2 s


def test_sooner_than_answers_only_when_a_timer_set_since_the_last_look_is_earlier() -> None:
    c = core(workers=2, learn=False)  # the timeouts are the only timers
    c.handle(Submitted(0.0, (task(0),)))
    assert c.sooner_than(float("inf")) == 10.0 == c.next_wakeup()
    assert c.sooner_than(10.0) is None  # nothing set since: the alarm at 10 stands
    c.handle(Submitted(1.0, (task(1),)))
    assert c.sooner_than(10.0) is None  # its timeout (11) is later than the alarm
    c.handle(passed(task(0), 2.0))  # the run behind the alarm ends: a wake-up at 10 finds nothing
    assert c.handle(Tick(10.0)) == [] and c.next_wakeup() == 11.0
    c.handle(passed(task(1), 10.5))
    c.handle(Submitted(10.5, (task(2),)))
    assert c.sooner_than(11.0) is None and c.sooner_than(float("inf")) == 20.5


def test_a_run_past_its_timeout_is_killed_retried_and_then_settled_as_a_timeout() -> None:
    c = core(retries=1, learn=False)  # no overdue looks: the timeout is the only timer
    t = task(0)
    c.handle(Submitted(0.0, (t,)))
    assert c.next_wakeup() == 10.0
    assert c.handle(Tick(9.9)) == []
    stop = only(c.handle(Tick(10.0)), StopWorker)
    assert stop == [StopWorker(WorkerId("verifier-0"), StopReason.TIMEOUT)]
    assert c.slots[WorkerId("verifier-0")].state is SlotState.STOPPING
    effects = c.handle(WorkerExited(10.1, WorkerId("verifier-0")))
    assert only(effects, StartWorker) == [StartWorker(WorkerId("verifier-1"))]  # the slot refilled
    assert not only(effects, Settled) and len(c.queue) == 1  # requeued, attempt 1
    (rerun,) = c.handle(WorkerUp(11.0, WorkerId("verifier-1")))
    assert isinstance(rerun, StartRun) and rerun.task.attempt == 1
    c.handle(Tick(21.0))
    effects = c.handle(WorkerExited(21.0, WorkerId("verifier-1")))
    (settled,) = only(effects, Settled)
    assert isinstance(settled, Settled) and isinstance(settled.outcome, ExecutionFault)
    assert settled.outcome.kind is FaultKind.TIMEOUT and c.counts.timeouts == 2


def test_a_retry_runs_to_the_limit_and_the_kill_waits_out_the_grace() -> None:
    """Issue 41, finding 6: a run stopped by the adaptive timeout (below the limit) is retried with
    the whole limit, and the worker is killed only a grace period after the run's own stop, which
    a sandboxed verifier enforces and reports."""
    c = core(retries=1, learn=False, grace_s=2.0)
    t = task(0)
    c.handle(Submitted(0.0, (t,)))
    c.handle(passed(t, 1.0, took=1.0))  # an anchor of 1 s: the next run of p0 stops at 1.5 s
    again = replace(task(0), task_id=TaskId("t0b"))
    (start,) = c.handle(Submitted(1.0, (again,)))
    assert isinstance(start, StartRun) and start.timeout_s == 1.5 and start.limit_s == TIMEOUTS.cap_s
    assert c.next_wakeup() == 1.0 + 1.5 + 2.0  # the timeout, then the grace
    fault = ExecutionFault(again.task_id, FaultKind.TIMEOUT, "stopped by the adaptive timeout")
    (rerun,) = only(c.handle(RunFinished(2.5, again.task_id, 0, fault, 1.0, 2.5)), StartRun)
    assert isinstance(rerun, StartRun) and rerun.task.attempt == 1
    assert rerun.timeout_s == rerun.limit_s == TIMEOUTS.cap_s  # the retry runs to the limit
    assert c.next_wakeup() == 2.5 + 10.0 + 2.0


def test_a_late_answer_of_a_superseded_attempt_changes_nothing() -> None:
    c = core(retries=1)
    t = task(0)
    c.handle(Submitted(0.0, (t,)))
    c.handle(Tick(10.0))
    c.handle(WorkerExited(10.0, WorkerId("verifier-0")))
    c.handle(WorkerUp(10.5, WorkerId("verifier-1")))
    assert c.handle(passed(t, 10.6)) == []  # attempt 0 is superseded: ignored
    effects = c.handle(passed(replace(t, attempt=1), 11.0))
    assert only(effects, Settled) and c.idle
    assert c.handle(passed(replace(t, attempt=1), 11.5)) == []  # settled: ignored


def test_an_answer_just_before_the_kill_counts_and_the_worker_is_still_replaced() -> None:
    c = core()
    t = task(0)
    c.handle(Submitted(0.0, (t,)))
    c.handle(Tick(10.0))  # the kill is sent
    effects = c.handle(passed(t, 10.01))
    assert only(effects, StartWorker) == [StartWorker(WorkerId("verifier-1"))]
    assert only(effects, Settled) and WorkerId("verifier-0") not in c.slots


def test_a_silent_worker_is_asked_then_declared_lost_and_its_run_retried() -> None:
    c = core(retries=1, learn=False, heartbeats=Heartbeats(every_s=1.0, timeout_s=3.0))
    t = task(0)
    c.handle(Submitted(0.0, (t,)))
    assert c.handle(Tick(1.0)) == [AskHeartbeat(WorkerId("verifier-0"))]
    assert c.handle(Tick(2.0)) == []  # one question at a time
    c.handle(HeartbeatAnswered(2.5, WorkerId("verifier-0")))
    assert c.next_wakeup() == 3.5
    c.handle(Tick(3.5))
    stop = only(c.handle(Tick(6.5)), StopWorker)
    assert stop == [StopWorker(WorkerId("verifier-0"), StopReason.LOST)]
    effects = c.handle(WorkerExited(6.6, WorkerId("verifier-0")))
    assert c.counts.lost == 1 and len(c.queue) == 1 and only(effects, StartWorker)


def test_a_worker_that_dies_on_its_own_is_a_crash_retried_up_to_the_limit() -> None:
    c = core(retries=0)
    t = task(0)
    c.handle(Submitted(0.0, (t,)))
    effects = c.handle(WorkerExited(1.0, WorkerId("verifier-0"), "ActorDiedError"))
    (settled,) = only(effects, Settled)
    assert isinstance(settled, Settled) and isinstance(settled.outcome, ExecutionFault)
    assert settled.outcome.kind is FaultKind.CRASH and c.counts.died == 1


def test_a_gang_takes_all_its_workers_at_once_and_frees_them_together() -> None:
    c = core(workers=3)
    gang, single = task(0, slots=2), task(1)
    effects = c.handle(Submitted(0.0, (gang, single)))
    runs = only(effects, StartRun)
    assert [(r.task.task_id, len(r.gang)) for r in runs if isinstance(r, StartRun)] == [("t0", 1), ("t1", 0)]
    assert not c.free
    c.handle(passed(gang, 1.0))
    assert len(c.free) == 2


def test_a_cpu_stage_hands_prepared_work_on_as_a_fresh_task() -> None:
    c = core()
    t = task(0)
    c.handle(Submitted(0.0, (t,)))
    c.handle(Tick(3.0))
    effects = c.handle(RunFinished(5.0, t.task_id, 0, Prepared(t.task_id, b"x"), 4.0, 5.0))
    (handed,) = only(effects, HandedOn)
    assert isinstance(handed, HandedOn) and handed.task == replace(t, arrival=5.0)
    assert c.idle


def test_a_started_worker_that_never_comes_up_is_replaced() -> None:
    c = VerifyPoolCore(PoolParams(workers=1, timeouts=TIMEOUTS))
    (first,) = c.start()
    assert isinstance(first, StartWorker)
    effects = c.handle(WorkerExited(1.0, first.worker, "no such node"))
    assert only(effects, StartWorker) == [StartWorker(WorkerId("verifier-1"))]


def test_an_edge_outside_the_table_is_refused_by_name() -> None:
    c = core()
    with pytest.raises(IllegalTransition, match="verifier slot cannot go from idle to stopping"):
        c.slots[WorkerId("verifier-0")].to(SlotState.STOPPING)


def test_a_run_past_its_kinds_usual_time_is_reported_to_the_estimator_at_doubling_times() -> None:
    c = core()
    t = task(0)
    c.handle(Submitted(0.0, (t,)))
    first = c.next_wakeup()
    assert first is not None and first == pytest.approx(c.estimator.overdue_after("default"))
    before = c.estimator.remaining("default", "p0")  # what a queued sibling (same problem) expects
    c.handle(Tick(first))
    assert c.next_wakeup() == pytest.approx(2 * first)  # looked at again once it has run twice as long
    assert c.estimator.remaining("default", "p0") > before  # the slow run is a lower bound for it

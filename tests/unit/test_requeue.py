"""Requeue, backoff and parking of supervised jobs (Kueue's requeuing semantics), in the scheduler's
core: a preempted job waits again at once; a failed one behind a doubling backoff; too many failures
park it with the reason; each attempt's end counts once. And in the cluster simulator, which drives
the same core: evicted borrowers that requeue finish their work."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlsched.core.cluster import ClusterCore
from rlsched.core.cluster_io import (
    CreatePlacementGroup,
    DriversAlive,
    JobEnded,
    JobFailed,
    JobFinished,
    JobId,
    JobRequeued,
    JobSpec,
    JobSubmitted,
    Refused,
    RemovePlacementGroup,
    Tick,
)
from rlsched.policy.cluster_model import AdmissionParams, ClassParams, QueueParams, RequeueParams
from rlsched.policy.durability import requeue_delay
from rlsched.policy.lifecycle import JobState
from rlsched.policy.placement import Gang, Node
from rlsched.sim.cluster import ClusterSim, summarise, synthetic_trace

NODE = Node("n0", {"GPU": 2.0, "CPU": 8.0})
GANG = Gang(({"GPU": 2.0, "CPU": 1.0},))  # the whole node: two jobs never run at once


def core(limit: int | None = 2) -> ClusterCore:
    params = AdmissionParams(
        {"high": ClassParams(100, preemptible=False), "low": ClassParams(10, grace_s=10.0)},
        {"q": QueueParams(nominal={"GPU": 2.0, "CPU": 8.0})},
        requeue=RequeueParams(base_s=30.0, max_s=100.0, limit=limit),
    )
    c = ClusterCore(params)
    c.handle(Tick(0.0, (NODE,)))
    return c


def spec(name: str, priority: str = "low", requeue: bool = True, attempt: int = 0) -> JobSpec:
    return JobSpec(name, "q", priority, (GANG,), requeue=requeue, attempt=attempt)


def submit_and_admit(c: ClusterCore, at: float, s: JobSpec) -> list[object]:
    assert not [e for e in c.handle(JobSubmitted(at, s)) if isinstance(e, Refused)]
    return c.handle(Tick(at))


def test_the_backoff_doubles_up_to_its_ceiling_then_the_job_is_parked() -> None:
    assert [requeue_delay(n, 30.0, 100.0, 5) for n in range(1, 7)] == [30.0, 60.0, 100.0, 100.0, 100.0, None]
    assert requeue_delay(50, 30.0, 100.0, None) == 100.0  # no limit: never parked
    assert requeue_delay(1, 30.0, 100.0, 0) is None  # limit 0: the first failure parks it
    with pytest.raises(ValueError, match="counts from 1"):
        requeue_delay(0, 30.0, 100.0, 5)


@given(st.integers(1, 60), st.floats(0, 1e4), st.floats(0, 1e5))
def test_the_backoff_never_shrinks_and_never_exceeds_its_ceiling(n: int, base: float, most: float) -> None:
    a, b = requeue_delay(n, base, most, None), requeue_delay(n + 1, base, most, None)
    assert a is not None and b is not None and a <= b <= most


def test_a_preempted_supervised_job_waits_again_at_once_and_its_next_attempt_takes_it_back() -> None:
    c = core()
    effects = submit_and_admit(c, 0.0, spec("rl"))
    assert any(isinstance(e, CreatePlacementGroup) for e in effects)
    c.handle(JobSubmitted(100.0, spec("eval", "high", requeue=False)))
    c.handle(Tick(100.0))  # evicts rl, with its 10 s grace
    assert c.poll("rl", 100.0)["stop_in"] == 10.0
    out = c.handle(JobFinished(105.0, JobId("rl"), preempted=True))  # it saved and stopped
    assert [type(e) for e in out] == [RemovePlacementGroup, JobRequeued]
    job = c.jobs[JobId("rl")]
    assert job.state is JobState.PENDING and job.requeues == 1 and job.failures == 0
    assert "preempted (for eval" in job.reason and "resumes from its last checkpoint" in job.reason
    # the supervisor's "exit status 3" for the same attempt changes nothing: the preemption was said
    c.handle(JobFailed(106.0, JobId("rl"), "exit status 3", attempt=0))
    assert job.failures == 0 and job.state is JobState.PENDING
    # its next attempt registers under the same name and takes the entry back
    assert not [e for e in c.handle(JobSubmitted(107.0, spec("rl", attempt=1))) if isinstance(e, Refused)]
    assert job.spec.attempt == 1
    c.handle(Tick(108.0))
    assert c.jobs[JobId("eval")].state is JobState.RUNNING and job.state is JobState.PENDING
    c.handle(JobFinished(200.0, JobId("eval")))
    c.handle(Tick(200.0))
    assert job.state is JobState.RUNNING  # admitted again once eval is done


def test_an_unsupervised_job_keeps_its_name_while_live_and_ends_as_before() -> None:
    c = core()
    submit_and_admit(c, 0.0, spec("rl", requeue=False))
    refused = [e for e in c.handle(JobSubmitted(1.0, spec("rl"))) if isinstance(e, Refused)]
    assert refused and "already running" in refused[0].reason
    c.handle(JobFailed(5.0, JobId("rl"), "TrainingFault: the recovery limit was reached"))
    job = c.jobs[JobId("rl")]
    assert (
        job.state is JobState.FAILED and job.reason == "failed: TrainingFault: the recovery limit was reached"
    )


def test_a_failed_job_backs_off_before_it_is_admitted_again() -> None:
    c = core()
    submit_and_admit(c, 0.0, spec("rl"))
    out = c.handle(JobFailed(50.0, JobId("rl"), "killed by SIGKILL", attempt=0))
    assert [type(e) for e in out] == [RemovePlacementGroup, JobRequeued]
    assert isinstance(out[1], JobRequeued) and out[1].not_before == 80.0
    job = c.jobs[JobId("rl")]
    assert job.state is JobState.PENDING and job.failures == 1
    assert "failed (killed by SIGKILL); retry 1 of 2 after a 30 s backoff" in job.reason
    assert c.next_wakeup() == 80.0  # the scheduler wakes when the backoff ends
    c.handle(JobSubmitted(55.0, spec("rl", attempt=1)))  # the supervisor's next attempt waits
    assert not c.handle(Tick(79.0)) and job.state is JobState.PENDING  # the node is free, yet it waits
    c.handle(Tick(80.0))
    assert job.state is JobState.RUNNING
    # the same attempt's failure, said twice (by the driver, then by its supervisor), counts once
    c.handle(JobFailed(90.0, JobId("rl"), "TrainingFault", attempt=1))
    c.handle(JobFailed(91.0, JobId("rl"), "exit status 1", attempt=1))
    assert job.failures == 2 and job.not_before == 150.0  # 60 s: the backoff doubled


def test_too_many_failures_park_the_job_with_the_reason_and_free_its_name() -> None:
    c = core(limit=2)
    submit_and_admit(c, 0.0, spec("rl"))
    at = 0.0
    for attempt in range(2):
        c.handle(JobFailed(at + 1, JobId("rl"), "CUDA error: out of memory", attempt=attempt))
        at = c.jobs[JobId("rl")].not_before or 0.0
        c.handle(JobSubmitted(at, spec("rl", attempt=attempt + 1)))
        c.handle(Tick(at))
        assert c.jobs[JobId("rl")].state is JobState.RUNNING
    out = c.handle(JobFailed(at + 1, JobId("rl"), "CUDA error: out of memory", attempt=2))
    job = c.jobs[JobId("rl")]
    assert job.state is JobState.PARKED and c.counts.parked == 1
    assert any(isinstance(e, JobEnded) and e.state is JobState.PARKED for e in out)
    assert any(isinstance(e, RemovePlacementGroup) for e in out)  # its groups go
    assert "parked after 3 failures (the last: CUDA error: out of memory)" in job.reason
    assert c.status()["jobs"]["rl"]["reason"] == job.reason
    assert not [e for e in c.handle(JobSubmitted(at + 2, spec("rl"))) if isinstance(e, Refused)]


def test_an_unanswered_eviction_and_a_vanished_driver_requeue_a_supervised_job() -> None:
    c = core()
    submit_and_admit(c, 0.0, spec("rl"))
    c.handle(JobSubmitted(100.0, spec("eval", "high", requeue=False)))
    c.handle(Tick(100.0))
    out = c.handle(Tick(110.0))  # the grace period ended without an answer
    job = c.jobs[JobId("rl")]
    assert job.state is JobState.PENDING and any(isinstance(e, JobRequeued) for e in out)
    assert c.jobs[JobId("eval")].state is JobState.RUNNING
    c.handle(JobFinished(200.0, JobId("eval")))
    c.handle(Tick(200.0))
    assert job.state is JobState.RUNNING
    c.handle(DriversAlive(300.0, frozenset(), after_s=60.0))  # its driver (and supervisor) vanished
    assert job.state is JobState.PENDING and job.failures == 1 and "its driver is gone" in job.reason


def test_a_cancelled_supervised_job_is_not_requeued() -> None:
    c = core()
    submit_and_admit(c, 0.0, spec("rl"))
    c.handle(JobSubmitted(1.0, spec("eval", "high", requeue=False)))  # waits (nothing preemptible)
    from rlsched.core.cluster_io import CancelRequested

    c.handle(CancelRequested(2.0, JobId("rl")))
    c.handle(JobFinished(3.0, JobId("rl"), preempted=True))
    assert c.jobs[JobId("rl")].state is JobState.CANCELLED


def test_in_the_simulator_evicted_borrowers_that_requeue_finish_their_work() -> None:
    """The trace of the simulator's borrowing test: borrowers evicted for gangs end with their work
    undone; with requeue they wait again and finish it, at the cost of what they did since their last
    save."""
    from dataclasses import replace

    from tests.unit.test_sim_cluster import BATCH, NODES, PARAMS, TRAIN

    trace = synthetic_trace([TRAIN, BATCH], hours=12, seed=3)
    ended = summarise(ClusterSim(NODES, PARAMS, trace, ["GPU"]).simulate())
    back = ClusterSim(NODES, PARAMS, [replace(t, requeue=True) for t in trace], ["GPU"])
    requeued = summarise(back.simulate())
    assert ended["unfinished"] > 0 and requeued["unfinished"] == 0
    assert back.core.counts.requeued >= ended["preemptions"] > 0

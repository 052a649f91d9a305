"""The cluster scheduler's bookkeeping without Ray: registration errors, cancel, the queue view, and
a job config's demand (gangs and elastic parts). Placement groups are exercised by
tests/e2e/test_cluster_ray.py on a real three-node Ray cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.cluster import JobSpec, JobState, Scheduler
from rlsched.admin import admission_params, load_admin
from rlsched.config import load_config
from rlsched.config_params import job_spec
from rlsched.policy.placement import Gang, Strategy

ROOT = Path(__file__).resolve().parents[2]


def scheduler() -> Scheduler:
    admin = load_admin(ROOT / "configs/admin/lab.yaml")
    return Scheduler(admission_params(admin), defaults={"research": "low"})


def spec(name: str = "j", queue: str = "research", priority: str = "") -> JobSpec:
    return JobSpec(name, queue, priority, (Gang(({"CPU": 1.0},)),))


def test_registration_names_what_is_wrong() -> None:
    s = scheduler()
    assert "queue 'nope' is not defined (queues: research)" in s.submit(spec(queue="nope"))
    assert "priority class 'urgent' is not defined (classes: high, low)" in s.submit(spec(priority="urgent"))
    assert s.submit(spec()) == ""
    assert s.jobs["j"].spec.priority == "low"  # the queue's default class
    assert "already pending" in s.submit(spec())
    assert s.poll("j")["state"] == "pending" and s.poll("other") == {"state": "unknown"}


def test_cancel_a_pending_job_and_the_queue_view() -> None:
    s = scheduler()
    s.submit(spec("a"))
    s.submit(spec("b", priority="high"))
    assert [r["job"] for r in s.queue()] == ["a", "b"]
    assert s.cancel("a") == "" and s.jobs["a"].state is JobState.CANCELLED
    assert [r["job"] for r in s.queue()] == ["b"]
    assert "no pending or running job named 'a' (live: b)" in s.cancel("a")
    assert s.submit(spec("a")) == ""  # a finished name may be used again


def test_a_job_configs_demand() -> None:
    cfg = load_config(ROOT / "configs/jobs/shared.yaml")
    got = job_spec(cfg, "shared", "research", "low")
    trainer, workers = got.gangs
    assert trainer == Gang(({"CPU": 1.0, "H100": 1.0},) * 2, Strategy.STRICT_PACK)
    assert workers.bundles == ({"CPU": 1.0, "A100": 1.0}, {"CPU": 0.5}) and workers.strategy is Strategy.PACK
    assert got.elastic == ({"CPU": 1.0, "A100": 1.0},)


def test_a_running_job_whose_driver_is_gone_gives_everything_back() -> None:
    s = scheduler()
    s.submit(spec("gone"))
    s.submit(spec("here"))
    for name in ("gone", "here"):
        s.jobs[name].to(JobState.RUNNING)
        s.jobs[name].started = 1000.0
    s.reap({"here"}, now=1030.0)  # within a minute of its start: still starting up
    assert s.jobs["gone"].state is JobState.RUNNING
    s.reap({"here"}, now=1100.0)
    assert s.jobs["gone"].state is JobState.PREEMPTED and "driver is gone" in s.jobs["gone"].reason
    assert s.jobs["here"].state is JobState.RUNNING


def running_with_an_elastic_part_to_give_back() -> tuple[Scheduler, Any, Any]:
    """A running job `rl` whose elastic part `elastic-0` (group `pg-e0`) was asked back at t=100 s
    with 10 s of grace: the scheduler, its core and the job."""
    from rlsched.core.cluster import _Part
    from rlsched.core.cluster_io import GroupId, PartId
    from rlsched.policy.cluster_model import Evict

    s = scheduler()
    s.submit(spec("rl"))
    core, job = s.core, s.jobs["rl"]
    job.to(JobState.RUNNING)
    job.started = 0.0
    job.parts[PartId("elastic-0")] = _Part("a100-node", GroupId("pg-e0"), {"A100": 1.0})
    core._evict(job, Evict("rl", True, 10.0, "eval", "lower priority (low) in queue research"), now=100.0)
    return s, core, job


def test_an_eviction_is_an_order_with_a_deadline_then_the_groups_go() -> None:
    """The bookkeeping only, in the core: which placement groups go when (removing them on Ray is the
    e2e test's)."""
    from rlsched.core.cluster_io import GroupId, RemovePlacementGroup, Tick
    from rlsched.policy.cluster_model import Evict

    s, core, job = running_with_an_elastic_part_to_give_back()
    job.gangs = [(GroupId("pg-g0"), [("h100-node", {"H100": 2.0})])]
    view = core.poll("rl", 100.0)
    assert list(view["release"]) == ["elastic-0"] and view["parts"] == {} and view["stop_in"] is None
    assert view["why"] == "for eval: lower priority (low) in queue research"
    removed = [e.group for e in core.handle(Tick(105.0)) if isinstance(e, RemovePlacementGroup)]
    assert removed == [] and "elastic-0" in job.parts  # still within its grace period
    removed += [e.group for e in core.handle(Tick(110.0)) if isinstance(e, RemovePlacementGroup)]
    assert job.parts == {} and job.state is JobState.RUNNING  # the job carries on without it
    assert removed == ["pg-e0"]
    core._evict(job, Evict("rl", False, 10.0, "eval", "lower priority (low) in queue research"), now=200.0)
    assert core.poll("rl", 200.0)["stop_in"] == 10.0
    removed += [e.group for e in core.handle(Tick(210.0)) if isinstance(e, RemovePlacementGroup)]
    assert job.state is JobState.PREEMPTED and removed == ["pg-e0", "pg-g0"]
    s.finished("rl", preempted=True)  # the driver's late answer changes nothing
    assert job.state is JobState.PREEMPTED


def test_the_replay_takes_events_in_the_order_the_core_took_them() -> None:
    """An event stamped before the one fed ahead of it (a driver read the clock, then waited for a
    lock or a Ray call) is replayed where the core took it: run at its stamp, it went ahead of an
    elastic part's release, and the replay of a correct run differed (the cluster e2e test's flake)."""
    from rlsched.core.cluster import ClusterTrace
    from rlsched.core.cluster_io import DriversAlive, JobId, PartId, PartReleased, Tick
    from rlsched.sim.replay import compare, replay

    _, core, _ = running_with_an_elastic_part_to_give_back()
    trace = ClusterTrace.begin(core)
    events = (
        Tick(101.0),
        PartReleased(102.0, JobId("rl"), PartId("elastic-0")),
        DriversAlive(101.5, frozenset({"rl"}), 60.0),  # stamped before the release, fed after it
        Tick(102.5),
    )
    for event in events:
        trace.add(event, core.handle(event))
    assert [type(e).__name__ for _, effects in trace.steps for e in effects] == ["RemovePlacementGroup"]
    assert compare(trace, replay(trace)) == []

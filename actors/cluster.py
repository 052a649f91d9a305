"""The cluster scheduler on Ray: many RL jobs on one cluster, admitted by the pure admission policy.

`rlsched admin start FILE` creates one named, detached actor (`rlsched-scheduler` in the `rlsched`
namespace) holding the admin file's parameters. Every `cycle_s` it reads the node inventory from Ray
(each alive node's resources and labels), builds a `ClusterSnapshot` of its own bookkeeping and runs
`rlsched.policy.admission.admit`, the same call the cluster simulator makes:

- `Admit`: one placement group per gang, each bundle pinned to the node the policy chose (Ray's
  `bundle_label_selector` on the `ray.io/node-id` label), detached so that it outlives the driver
  that asked; one single-bundle group per elastic part placed. The job's driver picks them up.
- `Evict`: the owner is asked, through its next poll, to give back its elastic parts (the fleet
  preempts those instances: their requests resume elsewhere from the tokens saved every
  `store.flush_s`) or to stop as a whole; after the class's grace period the placement groups are
  removed whether or not it answered, which ends the actors in them.
- `Grow`: a running job's missing elastic parts, granted again when there is room.
- `Wait`: the reason, shown by `rlsched queue`.

A job's driver (`rlsched run --queue Q --priority P`, or `rlsched submit`, or any `rlsched run`
while a scheduler exists) registers its `JobSpec`, polls until admitted, runs inside the placement
groups it was given, reports elastic parts it released, and says when it is done. Jobs run alone,
as before, when no scheduler exists.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from actors.scale import running_jobs
from rlsched.config import JobConfig
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
from rlsched.policy.placement import Gang, Node, Resources, Strategy, minus

NAMESPACE = "rlsched"
SCHEDULER_NAME = "rlsched-scheduler"
NODE_NAME_LABEL = "rlsched/name"  # a node's name in reasons (else the first 8 hex digits of its id)
_SKIP = ("node:", "object_store_memory", "memory", "accelerator_type:")


@dataclass(frozen=True)
class JobSpec:
    """What a job asks of the cluster: its gangs (all or nothing) and its elastic parts."""

    name: str
    queue: str
    priority: str
    gangs: tuple[Gang, ...]
    elastic: tuple[Resources, ...] = ()


def job_spec(cfg: JobConfig, name: str, queue: str, priority: str) -> JobSpec:
    """A job config's demand: the training ranks as one gang under their placement strategy; the
    static rollout instances and verifier workers as a second gang (PACK); `rollout.elastic`
    instances as elastic parts."""
    t, r, v = cfg.trainer, cfg.rollout, cfg.verifier
    rank: dict[str, float] = {"CPU": t.cpus_per_rank, **t.resources}
    if t.gpus_per_rank:
        rank["GPU"] = t.gpus_per_rank
    instance = {"CPU": r.cpus_per_instance, **r.resources}
    workers = [dict(instance) for _ in range(r.instances)]
    workers += [{"CPU": v.cpus_per_worker} for _ in range(v.workers)]
    workers += [{"CPU": 1.0, "GPU": 1.0} for _ in range(v.gpu_workers)]
    gangs = (
        Gang(tuple(dict(rank) for _ in range(t.ranks)), Strategy(t.placement_strategy.value)),
        Gang(tuple(workers), Strategy.PACK),
    )
    return JobSpec(name, queue, priority, gangs, tuple(dict(instance) for _ in range(r.elastic)))


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    PREEMPTED = "preempted"  # evicted as a whole; its driver stopped
    CANCELLED = "cancelled"


_NEXT: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.DONE, JobState.PREEMPTED, JobState.CANCELLED}),
    JobState.DONE: frozenset(),
    JobState.PREEMPTED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


@dataclass
class _Part:
    node: str
    pg: PlacementGroup
    resources: Resources
    release_by: float | None = None  # asked to give it back by then


@dataclass
class _Job:
    spec: JobSpec
    submitted: float
    state: JobState = JobState.PENDING
    reason: str = "waiting for the next admission cycle"
    started: float | None = None
    gangs: list[tuple[PlacementGroup, list[tuple[str, Resources]]]] = field(default_factory=list)
    parts: dict[str, _Part] = field(default_factory=dict)  # elastic parts held, by part id
    next_part: int = 0
    stop_by: float | None = None  # asked to stop as a whole by then
    why_evicted: str = ""
    cancel: bool = False

    def to(self, target: JobState) -> None:
        if target not in _NEXT[self.state]:
            raise ValueError(f"job {self.spec.name}: {self.state} -> {target} is not a transition")
        self.state = target


def inventory() -> tuple[tuple[Node, ...], dict[str, str]]:
    """Alive Ray nodes as the policy sees them: resources (Ray's bookkeeping keys left out), labels,
    and a name (the `rlsched/name` label, else the id's first 8 hex digits); and name -> node id."""
    out, ids = [], {}
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        labels = dict(n.get("Labels") or {})
        capacity = {k: float(v) for k, v in n["Resources"].items() if not k.startswith(_SKIP)}
        name = labels.get(NODE_NAME_LABEL, n["NodeID"][:8])
        out.append(Node(name, capacity, labels))
        ids[name] = n["NodeID"]
    return tuple(sorted(out, key=lambda x: x.name)), ids


class Scheduler:
    """The scheduler's state and one admission cycle; the Ray actor below runs it in a loop."""

    def __init__(
        self, params: AdmissionParams, cycle_s: float = 0.5, defaults: dict[str, str] | None = None
    ) -> None:
        self.params, self.cycle_s = params, cycle_s
        self.defaults = defaults or {}  # queue -> its default priority class
        self.jobs: dict[str, _Job] = {}
        self.lock = threading.RLock()
        self.nodes: tuple[Node, ...] = ()
        self.node_ids: dict[str, str] = {}
        self.history: dict[str, dict[str, float]] = {}
        self._last_cycle = time.time()
        self.cycles = 0

    # -- what drivers and the CLI call ----------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        with self.lock:
            if spec.queue not in self.params.queues:
                return (
                    f"queue {spec.queue!r} is not defined (queues: {', '.join(sorted(self.params.queues))})"
                )
            if not spec.priority:
                if spec.queue not in self.defaults:
                    return f"queue {spec.queue!r} has no default priority class; give one with --priority"
                spec = replace(spec, priority=self.defaults[spec.queue])
            if spec.priority not in self.params.classes:
                return (
                    f"priority class {spec.priority!r} is not defined "
                    f"(classes: {', '.join(sorted(self.params.classes))})"
                )
            old = self.jobs.get(spec.name)
            if old is not None and old.state in (JobState.PENDING, JobState.RUNNING):
                return f"a job named {spec.name!r} is already {old.state}; give this one another name (--out)"
            self.jobs[spec.name] = _Job(spec, time.time())
            return ""

    def poll(self, name: str) -> dict[str, Any]:
        """What the job's driver must know: its state and reason, its placement groups, elastic parts
        to start or give back, whether to stop."""
        with self.lock:
            job = self.jobs.get(name)
            if job is None:
                return {"state": "unknown"}
            now = time.time()
            return {
                "state": str(job.state),
                "reason": job.reason,
                "gangs": [pg for pg, _ in job.gangs],
                "parts": {p: part.pg for p, part in job.parts.items() if part.release_by is None},
                "release": {
                    p: max(0.0, part.release_by - now) for p, part in job.parts.items() if part.release_by
                },
                "stop_in": None if job.stop_by is None else max(0.0, job.stop_by - now),
                "why": job.why_evicted,
                "cancel": job.cancel,
            }

    def released(self, name: str, part: str) -> None:
        with self.lock:
            job = self.jobs.get(name)
            if job is not None and part in job.parts:
                self._drop_part(job, part)

    def finished(self, name: str, preempted: bool = False) -> None:
        with self.lock:
            job = self.jobs.get(name)
            if job is None or job.state not in (JobState.PENDING, JobState.RUNNING):
                return
            self._release_all(job)
            if job.state is JobState.PENDING or job.cancel:
                job.to(JobState.CANCELLED)
            else:
                job.to(JobState.PREEMPTED if preempted else JobState.DONE)

    def cancel(self, name: str) -> str:
        with self.lock:
            job = self.jobs.get(name)
            if job is None or job.state not in (JobState.PENDING, JobState.RUNNING):
                live = [n for n, j in self.jobs.items() if j.state in (JobState.PENDING, JobState.RUNNING)]
                return f"no pending or running job named {name!r} (live: {', '.join(live) or 'none'})"
            job.cancel = True
            if job.state is JobState.PENDING:
                job.to(JobState.CANCELLED)
                job.reason = "cancelled"
            return ""

    def queue(self) -> list[dict[str, Any]]:
        with self.lock:
            now = time.time()
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
        with self.lock:
            running = [j for j in self.jobs.values() if j.state is JobState.RUNNING]
            free = self._free()
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
                    }
                    for n, j in self.jobs.items()
                },
                "usage": usage_by_queue([self._running(j) for j in running]),
            }

    # -- the admission cycle ----------------------------------------------------------------------------
    def cycle(self) -> None:
        with self.lock:
            now = time.time()
            self._expire(now)
            self._refresh_nodes()
            running = [j for j in self.jobs.values() if j.state is JobState.RUNNING]
            snapshot_running = tuple(self._running(j) for j in running)
            if self.params.usage_half_life_s:
                dt = now - self._last_cycle
                self.history = decay_usage(
                    self.history, usage_by_queue(snapshot_running), dt, self.params.usage_half_life_s
                )
            self._last_cycle = now
            pending = tuple(
                PendingJob(n, j.spec.queue, j.spec.priority, j.submitted, j.spec.gangs, j.spec.elastic)
                for n, j in self.jobs.items()
                if j.state is JobState.PENDING
            )
            evicting = {
                j.spec.name: j.stop_by is None
                for j in running
                if j.stop_by is not None or any(p.release_by for p in j.parts.values())
            }
            history = self.history if self.params.usage_half_life_s else None
            snapshot = ClusterSnapshot(self.nodes, snapshot_running, pending, evicting, history)
            for d in admit(snapshot, now, self.params):
                if isinstance(d, Admit):
                    self._start(self.jobs[d.job], d, now)
                elif isinstance(d, Evict):
                    self._evict(self.jobs[d.job], d, now)
                elif isinstance(d, Grow):
                    self._grow(self.jobs[d.job], d.elastic_nodes)
                elif isinstance(d, Wait):
                    self.jobs[d.job].reason = d.reason
            self.cycles += 1

    def release_everything(self) -> None:
        """Remove every job's placement groups (the scheduler is stopping)."""
        with self.lock:
            for job in self.jobs.values():
                self._release_all(job)

    def _refresh_nodes(self) -> None:
        self.nodes, self.node_ids = inventory()

    def reap(self, alive: set[str], now: float, after_s: float = 60.0) -> None:
        """Running jobs whose driver is gone (its inbox actor no longer exists) give everything back."""
        with self.lock:
            for name, job in self.jobs.items():
                started = job.started or now
                if job.state is JobState.RUNNING and name not in alive and now - started > after_s:
                    self._release_all(job)
                    job.to(JobState.PREEMPTED)
                    job.reason = "its driver is gone; its placement groups were removed"

    def _running(self, job: _Job) -> RunningJob:
        allocations = tuple(b for _, bundles in job.gangs for b in bundles)
        elastic = tuple((p.node, p.resources) for p in job.parts.values())
        missing = job.spec.elastic[len(job.parts) :]
        assert job.started is not None
        return RunningJob(
            job.spec.name, job.spec.queue, job.spec.priority, job.started, allocations, elastic, None, missing
        )

    def _free(self) -> dict[str, Resources]:
        free: dict[str, Resources] = {n.name: dict(n.capacity) for n in self.nodes}
        for j in self.jobs.values():
            if j.state is JobState.RUNNING:
                for node, res in (*self._running(j).allocations, *self._running(j).elastic):
                    if node in free:
                        free[node] = minus(free[node], res)
        return free

    def _group(self, name: str, bundles: list[Resources], nodes: list[str], strategy: str) -> PlacementGroup:
        selectors = [{"ray.io/node-id": self.node_ids[n]} for n in nodes]
        pg = placement_group(
            [dict(b) for b in bundles],
            strategy=strategy,
            name=name,
            lifetime="detached",
            bundle_label_selector=selectors,
        )
        ready, _ = ray.wait([pg.ready()], timeout=60)
        if not ready:
            remove_placement_group(pg)
            raise RuntimeError(f"placement group {name} was not ready within 60 s on {nodes}")
        return pg

    def _start(self, job: _Job, d: Admit, now: float) -> None:
        try:
            for i, (gang, placed) in enumerate(zip(job.spec.gangs, d.placements, strict=True)):
                bundles = list(gang.bundles)
                pg = self._group(
                    f"rlsched-{job.spec.name}-g{i}", bundles, list(placed.nodes), gang.strategy.value
                )
                job.gangs.append((pg, list(zip(placed.nodes, bundles, strict=True))))
        except RuntimeError as err:  # the inventory changed under us: try again next cycle
            self._release_all(job)
            job.reason = str(err)
            return
        job.to(JobState.RUNNING)
        job.started, job.reason = now, ""
        self._grow(job, d.elastic_nodes)

    def _grow(self, job: _Job, nodes: tuple[str, ...]) -> None:
        wanted = job.spec.elastic[len(job.parts) :]
        for node, res in zip(nodes, wanted, strict=False):
            part = f"elastic-{job.next_part}"
            job.next_part += 1
            try:
                pg = self._group(f"rlsched-{job.spec.name}-{part}", [res], [node], "PACK")
            except RuntimeError:
                return
            job.parts[part] = _Part(node, pg, res)

    def _evict(self, job: _Job, d: Evict, now: float) -> None:
        job.why_evicted = f"for {d.for_job}: {d.reason}"
        if d.elastic_only:
            for part in job.parts.values():
                part.release_by = part.release_by or now + d.grace_s
        else:
            job.stop_by = job.stop_by or now + d.grace_s

    def _expire(self, now: float) -> None:
        """Grace periods that ended: the placement groups go whether or not the owner answered."""
        for job in self.jobs.values():
            for p, part in list(job.parts.items()):
                if part.release_by is not None and now >= part.release_by:
                    self._drop_part(job, p)
            if job.state is JobState.RUNNING and job.stop_by is not None and now >= job.stop_by:
                self._release_all(job)
                job.to(JobState.PREEMPTED)

    def _drop_part(self, job: _Job, part: str) -> None:
        _remove(job.parts.pop(part).pg)

    def _release_all(self, job: _Job) -> None:
        for pg, _ in job.gangs:
            _remove(pg)
        for p in list(job.parts):
            self._drop_part(job, p)
        job.gangs = []


def _remove(pg: PlacementGroup) -> None:
    with contextlib.suppress(ValueError, ray.exceptions.RayError):
        remove_placement_group(pg)


@ray.remote(num_cpus=0, max_concurrency=8)
class SchedulerActor:
    """The detached actor: `Scheduler` plus a thread that runs a cycle every `cycle_s`."""

    def __init__(
        self, params: AdmissionParams, cycle_s: float = 0.5, defaults: dict[str, str] | None = None
    ) -> None:
        self.s = Scheduler(params, cycle_s, defaults)
        self._stop = threading.Event()
        self._error = ""
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        reaped = time.time()
        while not self._stop.wait(self.s.cycle_s):
            try:
                self.s.cycle()
                if time.time() - reaped > 5.0:
                    reaped = time.time()
                    self.s.reap(_drivers_alive(), reaped)
                self._error = ""
            except Exception as err:  # noqa: BLE001 - kept and shown by `rlsched status`; next cycle retries
                self._error = f"{type(err).__name__}: {err}"

    def submit(self, spec: JobSpec) -> str:
        return self.s.submit(spec)

    def poll(self, name: str) -> dict[str, Any]:
        return self.s.poll(name)

    def released(self, name: str, part: str) -> None:
        self.s.released(name, part)

    def finished(self, name: str, preempted: bool = False) -> None:
        self.s.finished(name, preempted)

    def cancel(self, name: str) -> str:
        return self.s.cancel(name)

    def queue(self) -> list[dict[str, Any]]:
        return self.s.queue()

    def status(self) -> dict[str, Any]:
        return self.s.status() | {"error": self._error}

    def stop(self) -> None:
        self._stop.set()
        self.s.release_everything()


def _drivers_alive() -> set[str]:
    """Jobs whose driver runs: each one holds its `rlsched scale` inbox actor (actors/scale.py)."""
    return set(running_jobs())


def start_scheduler(
    params: AdmissionParams, cycle_s: float = 0.5, defaults: dict[str, str] | None = None
) -> Any:
    """Create the detached scheduler (ValueError if one exists)."""
    handle = SchedulerActor.options(name=SCHEDULER_NAME, namespace=NAMESPACE, lifetime="detached").remote(
        params, cycle_s, defaults
    )
    ray.get(handle.queue.remote())  # up and answering
    return handle


def find_scheduler() -> Any | None:
    try:
        return ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def stop_scheduler() -> bool:
    handle = find_scheduler()
    if handle is None:
        return False
    with contextlib.suppress(ray.exceptions.RayError):
        ray.get(handle.stop.remote(), timeout=30)
    ray.kill(handle)
    return True


class JobStopped(Exception):
    """The scheduler asked this job to stop: preempted as a whole, or cancelled."""

    def __init__(self, why: str, preempted: bool) -> None:
        super().__init__(why)
        self.preempted = preempted


class ClusterClient:
    """A job's driver side: register, wait for admission, then follow the scheduler's orders."""

    def __init__(self, handle: Any, spec: JobSpec) -> None:
        self.handle, self.spec = handle, spec
        self.started_parts: set[str] = set()

    def register(self) -> None:
        error = ray.get(self.handle.submit.remote(self.spec))
        if error:
            raise ValueError(error)

    def wait_admitted(self, log: Callable[[str], None], poll_s: float = 0.5) -> list[PlacementGroup]:
        """Block until admitted; say each new pending reason once. The gangs' placement groups."""
        said = ""
        while True:
            view = self.poll()
            if view["state"] == JobState.RUNNING:
                return list(view["gangs"])
            if view["state"] != JobState.PENDING:
                raise JobStopped(f"the scheduler ended this job while it waited ({view['state']})", False)
            if view["reason"] != said:
                said = view["reason"]
                log(f"pending in queue {self.spec.queue} ({self.spec.priority}): {said}")
            time.sleep(poll_s)

    def poll(self) -> dict[str, Any]:
        view: dict[str, Any] = ray.get(self.handle.poll.remote(self.spec.name))
        return view

    def released(self, part: str) -> None:
        ray.get(self.handle.released.remote(self.spec.name, part))

    def finished(self, preempted: bool = False) -> None:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self.handle.finished.remote(self.spec.name, preempted), timeout=30)

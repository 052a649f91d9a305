"""The cluster scheduler (`actors.cluster`) from outside: `rlsched admin` starts, finds and stops its
detached actor; a job's driver registers, waits for admission, then follows the scheduler's orders
(`ClusterClient`), and gets `JobStopped` when the scheduler ends the job.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.cluster import NAMESPACE, SCHEDULER_NAME, SchedulerActor
from rlsched.core.cluster_io import JobSpec
from rlsched.policy.cluster_model import AdmissionParams
from rlsched.policy.lifecycle import JobState


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
                priority = f" ({self.spec.priority})" if self.spec.priority else ""
                log(f"pending in queue {self.spec.queue}{priority}: {said}")
            time.sleep(poll_s)

    def poll(self) -> dict[str, Any]:
        view: dict[str, Any] = ray.get(self.handle.poll.remote(self.spec.name))
        return view

    def released(self, part: str) -> None:
        ray.get(self.handle.released.remote(self.spec.name, part))

    def finished(self, preempted: bool = False) -> None:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self.handle.finished.remote(self.spec.name, preempted), timeout=30)

    def failed(self, reason: str) -> None:
        """This attempt failed: the scheduler ends the job, or requeues it when it is supervised."""
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self.handle.failed.remote(self.spec.name, reason, self.spec.attempt), timeout=30)


DEFAULT_STATE = "~/.rlsched/scheduler.sqlite"  # on the head node, where the scheduler is pinned


def head_node_id() -> str:
    """The head node's id (the scheduler lives there, beside its state file and Ray's GCS)."""
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
            return str(n["NodeID"])
    return str(ray.get_runtime_context().get_node_id())


def start_scheduler(
    params: AdmissionParams,
    cycle_s: float = 0.5,
    defaults: dict[str, str] | None = None,
    state: str | None = DEFAULT_STATE,
) -> Any:
    """Create the detached scheduler (ValueError if one exists). With `state`, it keeps its state in
    that SQLite file on the head node, is pinned there, and Ray restarts it after a crash: it takes
    its state back, and callers' requests in flight are retried on the restarted actor."""
    durable: dict[str, Any] = {}
    if state:
        durable = {
            "max_restarts": -1,
            "max_task_retries": -1,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(head_node_id(), soft=False),
        }
    handle = SchedulerActor.options(
        name=SCHEDULER_NAME, namespace=NAMESPACE, lifetime="detached", **durable
    ).remote(params, cycle_s, defaults, state, uuid.uuid4().hex)
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


def report_attempt(address: str, name: str, why: str, attempt: int) -> dict[str, Any]:
    """A supervised job's attempt ended (`rlsched.job.supervise`): tell the scheduler on the cluster at
    `address` (a no-op where the attempt already said how), from a process of its own; its view."""
    import logging

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    try:
        handle = find_scheduler()
        if handle is None:
            return {"state": "unknown", "reason": "the cluster scheduler is gone"}
        view: dict[str, Any] = ray.get(handle.failed.remote(name, why, attempt), timeout=120)
        return view
    finally:
        ray.shutdown()

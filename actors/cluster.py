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

The scheduler survives its own death: its core is saved to SQLite (`rlsched.store.snapshots`)
after every event and before any effect is carried out; the actor is pinned to the head node and
restarted by Ray, takes the core back, and reconciles it with Ray (placement groups found by name;
a missing one is a failed placement). Callers' requests are retried on the restarted actor.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    remove_placement_group,
)

from actors.scale import running_jobs
from rlsched.core import cluster_io as cx
from rlsched.core.cluster import ClusterCore, ClusterTrace
from rlsched.core.cluster_io import GroupId, JobId, JobSpec, PartId
from rlsched.policy.cluster_model import AdmissionParams
from rlsched.policy.lifecycle import JobState
from rlsched.policy.placement import Node, Resources
from rlsched.store.snapshots import SnapshotStore

__all__ = ["JobSpec", "JobState", "Scheduler"]

NAMESPACE = "rlsched"
SCHEDULER_NAME = "rlsched-scheduler"
NODE_NAME_LABEL = "rlsched/name"  # a node's name in reasons (else the first 8 hex digits of its id)
_SKIP = ("node:", "object_store_memory", "memory", "accelerator_type:")


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
    """The scheduler's Ray side: a driver of `rlsched.core.cluster.ClusterCore`. Each call of a job's
    driver or the CLI becomes an event (on the wall clock, shared by every driver on the cluster);
    each cycle reads the node inventory; effects become placement groups made or removed."""

    def __init__(
        self,
        params: AdmissionParams,
        cycle_s: float = 0.5,
        defaults: dict[str, str] | None = None,
        state: Path | None = None,
        owner: str = "",
    ) -> None:
        self.cycle_s = cycle_s
        self.lock = threading.RLock()
        self.groups: dict[GroupId, PlacementGroup] = {}
        self.node_ids: dict[str, str] = {}
        self.trace: ClusterTrace | None = None
        self.store = SnapshotStore(state) if state is not None else None
        self.owner = owner
        restored = self.store.load("core", owner) if self.store is not None else None
        self.restored = restored is not None
        self.core: ClusterCore = restored or ClusterCore(params, defaults, at=time.time())
        with self.lock:
            if restored is not None:
                self._reconcile()
            self._save()

    def _save(self) -> None:
        """The core's state, fsync'ed: after every event it handled, before any effect is carried out."""
        if self.store is not None:
            self.store.save("core", self.owner, self.core)

    def _reconcile(self) -> None:
        """Restarted: the placement groups Ray still holds are taken back by name; one it does not hold
        (never made, or removed meanwhile) is a failed placement, which the core handles as such."""
        for job, group, part in self.core.held_groups():
            try:
                self.groups[group] = get_placement_group(group)
            except ValueError:
                why = f"its placement group {group} was gone when the scheduler restarted"
                self._feed(cx.PlacementFailed(time.time(), job, why, part))

    @property
    def jobs(self) -> dict[JobId, Any]:
        return self.core.jobs

    def record(self) -> ClusterTrace:
        """From now on, keep every event fed to the core and the effects it returned."""
        with self.lock:
            self.trace = ClusterTrace.begin(self.core)
            return self.trace

    def _feed(self, event: cx.Event) -> list[cx.Effect]:
        effects = self.core.handle(event)
        if self.trace is not None:
            self.trace.add(event, effects)
        self._save()
        self._apply(effects)
        return effects

    # -- what drivers and the CLI call ----------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        with self.lock:
            return _refusal(self._feed(cx.JobSubmitted(time.time(), spec)))

    def poll(self, name: str) -> dict[str, Any]:
        """What the job's driver must know (`ClusterCore.poll`), with its placement groups."""
        with self.lock:
            view = self.core.poll(name, time.time())
            if "gangs" in view:
                view["gangs"] = [self.groups[g] for g in view["gangs"]]
                view["parts"] = {p: self.groups[g] for p, g in view["parts"].items()}
            return view

    def released(self, name: str, part: str) -> None:
        with self.lock:
            self._feed(cx.PartReleased(time.time(), JobId(name), PartId(part)))

    def finished(self, name: str, preempted: bool = False) -> None:
        with self.lock:
            self._feed(cx.JobFinished(time.time(), JobId(name), preempted))

    def failed(self, name: str, reason: str, attempt: int = 0) -> dict[str, Any]:
        """The job's driver failed; what the scheduler made of it (the job's `poll` view: requeued
        and pending, parked, failed ...)."""
        with self.lock:
            self._feed(cx.JobFailed(time.time(), JobId(name), reason, attempt))
            return self.core.poll(name, time.time())

    def cancel(self, name: str) -> str:
        with self.lock:
            return _refusal(self._feed(cx.CancelRequested(time.time(), JobId(name))))

    def queue(self) -> list[dict[str, Any]]:
        with self.lock:
            return self.core.waiting(time.time())

    def status(self) -> dict[str, Any]:
        with self.lock:
            return self.core.status()

    def cycle(self) -> None:
        with self.lock:
            nodes, self.node_ids = inventory()
            self._feed(cx.Tick(time.time(), nodes))

    def reap(self, alive: set[str], now: float | None = None, after_s: float = 60.0) -> None:
        """Running jobs whose driver is gone (its inbox actor no longer exists) give everything back;
        stamped under the lock, after `alive` was listed (a Ray call of seconds on a busy machine)."""
        with self.lock:
            stamp = time.time() if now is None else now
            self._feed(cx.DriversAlive(stamp, frozenset(alive), after_s))

    def release_everything(self) -> None:
        """Remove every placement group the scheduler made (it is stopping)."""
        with self.lock:
            for group in list(self.groups):
                _remove(self.groups.pop(group))

    # -- effects -------------------------------------------------------------------------------------
    def _apply(self, effects: list[cx.Effect]) -> None:
        failed: set[JobId] = set()  # jobs whose placement failed in this batch: make nothing more
        for e in effects:
            if isinstance(e, cx.CreatePlacementGroup) and e.job not in failed:
                try:
                    self.groups[e.group] = self._group(e.group, list(e.bundles), list(e.nodes), e.strategy)
                except RuntimeError as err:  # the inventory changed under the cycle
                    if e.part is None:
                        failed.add(e.job)
                    self._feed(cx.PlacementFailed(time.time(), e.job, str(err), e.part))
            elif (
                isinstance(e, cx.RemovePlacementGroup) and (pg := self.groups.pop(e.group, None)) is not None
            ):
                _remove(pg)

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


def _refusal(effects: list[cx.Effect]) -> str:
    return next((e.reason for e in effects if isinstance(e, cx.Refused)), "")


def _remove(pg: PlacementGroup) -> None:
    with contextlib.suppress(ValueError, ray.exceptions.RayError):
        remove_placement_group(pg)


@ray.remote(num_cpus=0, max_concurrency=8)
class SchedulerActor:
    """The detached actor: `Scheduler` plus a thread that runs a cycle every `cycle_s`."""

    def __init__(
        self,
        params: AdmissionParams,
        cycle_s: float = 0.5,
        defaults: dict[str, str] | None = None,
        state: str | None = None,
        owner: str = "",
    ) -> None:
        path = Path(state).expanduser() if state else None
        self.s = Scheduler(params, cycle_s, defaults, path, owner)
        self._stop = threading.Event()
        self._error = ""
        self._state = str(path) if path else ""
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        reaped = time.time()
        while not self._stop.wait(self.s.cycle_s):
            try:
                self.s.cycle()
                if time.time() - reaped > 5.0:
                    reaped = time.time()
                    self.s.reap(_drivers_alive())
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

    def failed(self, name: str, reason: str, attempt: int = 0) -> dict[str, Any]:
        return self.s.failed(name, reason, attempt)

    def cancel(self, name: str) -> str:
        return self.s.cancel(name)

    def queue(self) -> list[dict[str, Any]]:
        return self.s.queue()

    def status(self) -> dict[str, Any]:
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        return self.s.status() | {"error": self._error, "state": self._state, "restarted": restarted}

    def pid(self) -> int:
        import os

        return os.getpid()

    def stop(self) -> None:
        self._stop.set()
        self.s.release_everything()

    def record(self) -> None:
        """Keep every event and its effects from now on (the trace-equivalence test's record)."""
        self.s.record()

    def trace(self) -> ClusterTrace | None:
        with self.s.lock:
            return copy.deepcopy(self.s.trace)


def _drivers_alive() -> set[str]:
    """Jobs whose driver runs: each one holds its `rlsched scale` inbox actor (actors/scale.py)."""
    return set(running_jobs())

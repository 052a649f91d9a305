"""What reaches a running job from outside, and what it says when only outside help can move it on.

- `rlsched scale JOB ...` drops commands in the job's inbox (`actors.scale`); the fleet takes them
  and the inbox gets the fleet's state back, for `rlsched scale JOB` to show. `rlsched finish JOB`
  drops one that ends the job after the iteration in progress (`finish_asked`).
- Under the cluster scheduler (`actors.cluster`), each poll's answer grants elastic parts (they
  join the fleet), reclaims some (preempted: their requests resume elsewhere from saved tokens), or
  stops the job (`JobStopped`: cancelled, or preempted as a whole).
- Requests that wait while no instance serves, joins or is due to join are stranded: the job fails
  at once, or, with an inbox to add instances through, says so once and waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from actors.cluster_client import ClusterClient, JobStopped
from actors.fleet import Fleet


class Orders:
    def __init__(
        self,
        fleet: Fleet,
        cluster: ClusterClient | None,
        inbox: Any,
        clock: Callable[[], float],
        log: Callable[[str], None],
        every_s: float = 1.0,
    ) -> None:
        self.fleet, self.cluster, self.inbox, self.clock, self.log = fleet, cluster, inbox, clock, log
        self.every_s = every_s
        self._polled = 0.0
        self.finish_asked = False  # `rlsched finish JOB`: the job ends after the iteration in progress

    def poll(self) -> None:
        """Take what arrived, at most once every `every_s`."""
        if self.clock() - self._polled < self.every_s:
            return
        self._polled = self.clock()
        self.follow_scheduler()
        if self.inbox is None:
            return
        for command in ray.get(self.inbox.take.remote()):
            if command.changes_fleet:
                self.fleet.scale(command)
            if command.finish and not self.finish_asked:
                self.finish_asked = True
                self.log("finish asked for (`rlsched finish`): the job ends after the iteration in progress")
        self.inbox.report.remote(self.fleet.snapshot())

    def follow_scheduler(self) -> None:
        """The cluster scheduler's orders: start the elastic instances it granted, give back those it
        reclaims, stop if told to."""
        if self.cluster is None:
            return
        view = self.cluster.poll()
        if view["cancel"]:
            raise JobStopped("cancelled with `rlsched cancel`", preempted=False)
        if view["stop_in"] is not None:
            raise JobStopped(f"preempted by the cluster scheduler ({view['why']})", preempted=True)
        for part in view["release"]:
            self.fleet.reclaim(part, f"the cluster scheduler reclaims it {view['why']}")
            self.cluster.released(part)
        for part, pg in view["parts"].items():
            self.fleet.grant(part, pg)

    def stranded(self, iteration: int, warned: bool) -> bool:
        """Requests wait and no instance serves or joins: fail, or (with `rlsched scale` at hand) say
        so once and wait for instances to be added. Returns whether it has said so."""
        if not self.fleet.stranded():
            return warned
        stranded = (
            f"iteration {iteration}: {len(self.fleet.core.pending)} request(s) wait but no rollout instance "
            "serves or is joining (the log says why they left)"
        )
        if self.inbox is None:
            raise RuntimeError(stranded)
        if not warned:
            self.log(stranded + "; waiting for `rlsched scale JOB --add N`")
        return True

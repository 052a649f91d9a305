"""`rlsched scale`: add or remove rollout instances of a running job from another process.

Every Ray job started by `rlsched run` owns a small named actor, its inbox (`rlsched-scale-JOB` in
the `rlsched` namespace; JOB is the name of the run's output directory). `rlsched scale JOB ...`
connects to the same cluster, drops a command in the inbox and prints the fleet as the job last
reported it. The controller takes the commands while it generates, and reports its fleet back. The
inbox lives and dies with the job's driver: it is pinned to the driver's node, so that losing
another node (with trainer ranks or instances on it, which the job recovers) never takes it along.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlsched.policy.lifecycle import Leave

NAMESPACE = "rlsched"


def inbox_name(job: str) -> str:
    return f"rlsched-scale-{job}"


@dataclass(frozen=True)
class ScaleCommand:
    add: int = 0
    receiver_gbps: float | None = None  # the added instances' ingress link
    remove: tuple[str, ...] = ()
    leave: Leave = Leave.DRAINING


@dataclass
class _Inbox:
    commands: list[ScaleCommand] = field(default_factory=list)
    fleet: dict[str, Any] = field(default_factory=dict)

    def submit(self, command: ScaleCommand) -> dict[str, Any]:
        self.commands.append(command)
        return self.fleet

    def take(self) -> list[ScaleCommand]:
        out, self.commands = self.commands, []
        return out

    def report(self, fleet: dict[str, Any]) -> None:
        self.fleet = fleet

    def status(self) -> dict[str, Any]:
        return self.fleet


ScaleInbox = ray.remote(num_cpus=0, max_concurrency=4)(_Inbox)


def open_inbox(job: str) -> Any:
    """The job's inbox, created by its driver (one job of a name per cluster at a time)."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ScaleInbox.options(name=inbox_name(job), namespace=NAMESPACE, scheduling_strategy=here).remote()


def running_jobs() -> list[str]:
    prefix = inbox_name("")
    return sorted(
        a["name"].removeprefix(prefix)
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix)
    )

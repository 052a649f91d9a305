"""`rlsched scale`: add or remove rollout instances of a running job from another process (and
`rlsched finish`: end it after the iteration in progress, with its final outputs).

Every Ray job started by `rlsched run` owns a small named actor, its inbox (`rlsched-scale-JOB` in
the `rlsched` namespace; JOB is the name of the run's output directory). `rlsched scale JOB ...`
connects to the job's cluster, drops a command in the inbox and prints the fleet as the job last
reported it. The controller takes the commands while it generates, and reports its fleet back. The
inbox lives and dies with the job's driver: it is pinned to the driver's node, so that losing
another node (with trainer ranks or instances on it, which the job recovers) never takes it along.

Which cluster: with `--address` the one named; otherwise the one the job's driver recorded when it
started (`rlsched.job.registry`: a small file per job under Ray's temporary root), so that jobs on
this machine, each on an embedded cluster of its own, are told apart without asking every cluster. A
job without a live record (on a `ray start` cluster that another user's shell started, say) is
looked for with `ray.init(address="auto")`. A local cluster takes only clients that send its token
(Ray 2.60): `rlsched scale` sends it where `RAY_AUTH_MODE` is unset and a token is at hand
(`rlsched.cli_commands.send_ray_token_if_present`, before Ray is imported: Ray reads the mode when
it is imported).
"""

from __future__ import annotations

import logging
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
    finish: bool = False  # `rlsched finish`: end after the iteration in progress, outputs written

    @property
    def changes_fleet(self) -> bool:
        return bool(self.add or self.remove)


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


def connect(address: str) -> None:
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)

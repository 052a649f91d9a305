"""`rlsched scale`: add or remove rollout instances of a running job from another process.

Every Ray job started by `rlsched run` owns a small named actor, its inbox (`rlsched-scale-JOB` in
the `rlsched` namespace; JOB is the name of the run's output directory). `rlsched scale JOB ...`
connects to the same cluster, drops a command in the inbox and prints the fleet as the job last
reported it. With the default `--address auto` it looks for the job on every Ray cluster running on
this machine (two jobs started with `rlsched run` each embed their own), and asks for `--address`
only when two clusters hold a job of that name. The controller takes the commands while it
generates, and reports its fleet back. The inbox lives and dies with the job's driver: it is pinned
to the driver's node, so that losing another node (with trainer ranks or instances on it, which the
job recovers) never takes it along.
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


def local_clusters() -> list[str]:
    """The GCS addresses of the Ray clusters running on this machine: the one `ray start` recorded
    last first, then every other whose raylet runs here (an embedded cluster records none). As
    `ray.init(address="auto")` does for a cluster it finds here, the machine's Ray token
    (`~/.ray/auth_token`, which Ray 2.60 gives every local cluster) is sent to them, unless
    `RAY_AUTH_MODE` says otherwise; an explicit `--address` sends it only under RAY_AUTH_MODE=token."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )
    from ray._private.services import find_bootstrap_address, find_gcs_addresses

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)

    recorded = find_bootstrap_address(None)
    found = sorted(find_gcs_addresses())
    return [recorded, *(a for a in found if a != recorded)] if recorded in found else found


@dataclass(frozen=True)
class JobSearch:
    """Where a job's inbox was found: the clusters holding one of that name, and every job seen."""

    holders: tuple[str, ...]
    jobs: tuple[str, ...]


def connect(address: str) -> None:
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)


def find_job(job: str, candidates: list[str]) -> JobSearch:
    """Connects to each candidate cluster in turn and asks whether it holds `job`'s inbox. Leaves the
    driver connected to the holder when exactly one candidate holds it and it was the last asked
    (the usual case of one cluster: one connection); disconnected otherwise. A cluster that does not
    answer (one shutting down as the search passes) is skipped; when none answers, its error is
    raised."""
    holders: list[str] = []
    jobs: set[str] = set()
    error: Exception | None = None
    for i, address in enumerate(candidates):
        try:
            connect(address)
        except (ConnectionError, RuntimeError) as err:
            error = err
            continue
        names = running_jobs()
        jobs.update(names)
        if job in names:
            holders.append(address)
        if not (i == len(candidates) - 1 and holders == [address]):
            ray.shutdown()
    if error is not None and not holders and not jobs:
        raise error
    return JobSearch(tuple(holders), tuple(sorted(jobs)))

"""`rlsched scale`: add or remove rollout instances of a running job from another process.

Every Ray job started by `rlsched run` owns a small named actor, its inbox (`rlsched-scale-JOB` in
the `rlsched` namespace; JOB is the name of the run's output directory). `rlsched scale JOB ...`
connects to the job's cluster, drops a command in the inbox and prints the fleet as the job last
reported it. The controller takes the commands while it generates, and reports its fleet back. The
inbox lives and dies with the job's driver: it is pinned to the driver's node, so that losing
another node (with trainer ranks or instances on it, which the job recovers) never takes it along.

Which cluster: with `--address` the one named; otherwise the one the job's driver recorded when it
started (`record_job`: a small file per job under Ray's temporary root, `RAY_TMPDIR` or else the
system's), so that jobs on this machine, each on an embedded cluster of its own, are told apart
without asking every cluster. A job without a live record (on a `ray start` cluster that another
user's shell started, say) is looked for with `ray.init(address="auto")`. A local cluster takes only
clients that send its token (Ray 2.60): `rlsched scale` sends it where `RAY_AUTH_MODE` is unset and a
token is at hand (`rlsched.cli_commands.send_ray_token_if_present`, before Ray is imported: Ray reads
the mode when it is imported).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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


def jobs_dir() -> Path:
    """Where this machine's running jobs record their cluster: under Ray's temporary root, so that
    `rlsched scale` in a shell with the same root finds them."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "rlsched-jobs"


def record_job(job: str, address: str) -> Callable[[], None]:
    """Record that `job`'s driver (this process) runs on the cluster whose GCS is at `address`; the
    function that removes the record again (only this driver's: a later job of the name keeps its
    own)."""
    path = jobs_dir() / f"{job}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"job": job, "address": address, "pid": os.getpid()}
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(body))
    partial.replace(path)

    def forget() -> None:
        if _read(path).get("pid") == os.getpid():
            path.unlink(missing_ok=True)

    return forget


def _read(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def recorded(job: str) -> str | None:
    """The GCS address of the cluster `job`'s driver recorded, if that driver is still alive."""
    body = _read(jobs_dir() / f"{job}.json")
    address = body.get("address")
    return address if isinstance(address, str) and _alive(body.get("pid")) else None


def recorded_jobs() -> list[str]:
    """The jobs whose drivers recorded a cluster here and are alive."""
    if not jobs_dir().is_dir():
        return []
    return sorted(p.stem for p in jobs_dir().glob("*.json") if recorded(p.stem) is not None)


def connect(address: str) -> None:
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)

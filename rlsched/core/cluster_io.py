"""What goes in and out of the cluster scheduler's core (`rlsched.core.cluster`): the ids, a job's
spec, the events its drivers feed it and the effects it returns, in the order they are carried out.
The Ray scheduler actor (`actors.cluster`) and the cluster simulator (`rlsched.sim.cluster`) both
speak it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

from rlsched.policy.lifecycle import JobState
from rlsched.policy.placement import Gang, Node, Resources

JobId = NewType("JobId", str)
PartId = NewType("PartId", str)  # one elastic part of a job: `elastic-{n}`
GroupId = NewType("GroupId", str)  # a placement group the scheduler made: `rlsched-{job}-{g0|elastic-n}`
NodeName = NewType("NodeName", str)


@dataclass(frozen=True)
class JobSpec:
    """What a job asks of the cluster: its gangs (all or nothing) and its elastic parts."""

    name: str
    queue: str
    priority: str
    gangs: tuple[Gang, ...]
    elastic: tuple[Resources, ...] = ()
    requeue: bool = False  # a supervisor brings the driver back: requeue it rather than end it
    attempt: int = 0  # the supervisor's attempt number (a failure report names the attempt it ends)
    walltime_s: float | None = None  # its expected run time (None: its priority class's default)


# -- events ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSubmitted:
    at: float
    spec: JobSpec


@dataclass(frozen=True)
class Tick:
    """A cycle: `nodes` is the inventory the driver sees now (None: as before)."""

    at: float
    nodes: tuple[Node, ...] | None = None


@dataclass(frozen=True)
class PartReleased:
    at: float
    job: JobId
    part: PartId


@dataclass(frozen=True)
class JobFinished:
    """The job's driver is done: finished, or stopped because it was told to (`preempted`)."""

    at: float
    job: JobId
    preempted: bool = False


@dataclass(frozen=True)
class JobFailed:
    """The job's driver failed (`reason`): reported by the driver itself, or by its supervisor after
    the process exited. `attempt` is the supervisor's attempt that failed; a report for an attempt
    already over (requeued, or its failure counted) changes nothing."""

    at: float
    job: JobId
    reason: str
    attempt: int = 0


@dataclass(frozen=True)
class CancelRequested:
    at: float
    job: JobId


@dataclass(frozen=True)
class PlacementFailed:
    """A placement group could not be made (the inventory changed under the cycle): a gang's failure
    sends the job back to wait; an elastic part's only drops that part."""

    at: float
    job: JobId
    reason: str
    part: PartId | None = None


@dataclass(frozen=True)
class DriversAlive:
    """The jobs whose driver is known to run; a running job missing from it for `after_s` since its
    start has lost its driver."""

    at: float
    alive: frozenset[str]
    after_s: float = 60.0


Event = (
    JobSubmitted
    | Tick
    | PartReleased
    | JobFinished
    | JobFailed
    | CancelRequested
    | PlacementFailed
    | DriversAlive
)

# -- effects ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreatePlacementGroup:
    group: GroupId
    job: JobId
    bundles: tuple[Resources, ...]
    nodes: tuple[str, ...]  # one per bundle: where the policy placed it
    strategy: str
    part: PartId | None = None  # an elastic part's group


@dataclass(frozen=True)
class RemovePlacementGroup:
    group: GroupId


@dataclass(frozen=True)
class JobStarted:
    job: JobId


@dataclass(frozen=True)
class JobEnded:
    job: JobId
    state: JobState


@dataclass(frozen=True)
class JobRequeued:
    """A supervised job stopped running (preempted, or failed) and waits again; its driver's
    supervisor brings it back (`not_before`: not admitted before then)."""

    job: JobId
    reason: str
    not_before: float | None = None


@dataclass(frozen=True)
class Refused:
    """A request the scheduler will not take: `reason` names the problem and the fix."""

    job: JobId
    reason: str


Effect = CreatePlacementGroup | RemovePlacementGroup | JobStarted | JobEnded | JobRequeued | Refused

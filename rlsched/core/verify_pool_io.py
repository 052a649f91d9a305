"""A verifier pool stage's vocabulary: its parameters, the events a driver feeds `VerifyPoolCore`
(`rlsched.core.verify_pool`), the effects it gets back, and the decision log's lines for them.

Kept apart from the core so that a driver reads what it may send and must carry out in one place,
and the core's module holds nothing but its state and rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from rlsched.policy.timeouts import TimeoutParams
from rlsched.policy.verify import BatchState, PendingVerification, TaskId, VerifyParams, WorkerId
from verifiers.protocol import Outcome, Prepared

# -- configuration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeats:
    every_s: float = 2.0  # how often a busy worker is asked how it is doing
    timeout_s: float = 10.0  # silent this long: lost, and killed


@dataclass(frozen=True)
class Scaling:
    """`advise_pool` every `interval_s` (distrs): the pool's size over time, up to `max_workers`."""

    max_workers: int
    interval_s: float = 1.0
    worker_cost: float = 1.0  # one worker-second against one idle device-second of a training group


@dataclass(frozen=True)
class PoolParams:
    verify: VerifyParams = field(default_factory=VerifyParams)
    workers: int = 2
    retries: int = 0  # retries of a retryable execution fault, per task
    timeouts: TimeoutParams = field(default_factory=TimeoutParams)
    heartbeats: Heartbeats | None = None  # None: workers are never asked (the simulator's never fall silent)
    scaling: Scaling | None = None
    learn: bool = True  # feed the estimator (off where nothing reads it: fifo without scaling)
    # seconds past a run's timeout before the worker is killed: a sandboxed verifier stops the run
    # at the timeout itself and needs a moment to report (the simulator's runs report at once)
    grace_s: float = 0.0
    name: str = "verifier"  # workers are named `{name}-{n}`


# -- events (what happened) and effects (what to do) ------------------------------------------------
# Values, never changed once made; not frozen only because a frozen dataclass costs three times as
# much to build, and the simulator builds several per sample.


@dataclass(slots=True)
class Submitted:
    """Samples ready to verify, queued together (then offered to free workers once)."""

    at: float
    tasks: tuple[PendingVerification, ...]


@dataclass(slots=True)
class WorkerUp:
    """A started worker answered its first call: it may take work."""

    at: float
    worker: WorkerId


@dataclass(slots=True)
class WorkerExited:
    """A worker's process has ended, observed now: it was killed, died on its own, or never started."""

    at: float
    worker: WorkerId
    error: str = ""


@dataclass(slots=True)
class RunFinished:
    """A run's call returned: its outcome and when the worker itself started and ended it. A call
    that failed with the worker still alive is reported as a CRASH fault by the driver."""

    at: float
    task_id: TaskId
    attempt: int
    outcome: Outcome | Prepared
    w_start: float
    w_end: float


@dataclass(slots=True)
class HeartbeatAnswered:
    at: float
    worker: WorkerId


@dataclass(slots=True)
class Tick:
    """Time has passed: due timers fire. `batches`, when given, replaces what the pool knows of the
    batches its work belongs to (what their training groups still wait for)."""

    at: float
    batches: tuple[BatchState, ...] | None = None


Event = Submitted | WorkerUp | WorkerExited | RunFinished | HeartbeatAnswered | Tick


class StopReason(StrEnum):
    TIMEOUT = "timeout"
    LOST = "lost"
    PREEMPTED = "preempted"


@dataclass(slots=True)
class StartWorker:
    worker: WorkerId


@dataclass(slots=True)
class ReleaseWorker:
    """An idle worker the pool no longer needs (scaling down): end it; no replacement follows."""

    worker: WorkerId


@dataclass(slots=True)
class StartRun:
    """Verify `task` on `worker`; `gang`'s workers are held idle for it (their cores are its own)."""

    task: PendingVerification
    worker: WorkerId
    gang: tuple[WorkerId, ...]
    timeout_s: float  # this attempt's stop: the adaptive timeout, or on a retry the limit
    limit_s: float = math.inf  # the task's time limit: a run stopped there is a wrong answer


@dataclass(slots=True)
class StopWorker:
    """Kill the worker; its exit is to be reported as `WorkerExited`."""

    worker: WorkerId
    reason: StopReason


@dataclass(slots=True)
class AskHeartbeat:
    worker: WorkerId


@dataclass(slots=True)
class RunEnded:
    """One run is over (for the driver's span): `outcome` names what ended it."""

    task: PendingVerification
    worker: WorkerId
    gang: tuple[WorkerId, ...]
    dispatched: float
    at: float
    w_start: float
    outcome: str
    free_at_arrival: bool


@dataclass(slots=True)
class Settled:
    task_id: TaskId
    outcome: Outcome


@dataclass(slots=True)
class HandedOn:
    """The CPU stage prepared it: the GPU stage takes `task` (arriving now, attempt 0)."""

    task: PendingVerification
    prepared: Prepared


@dataclass(slots=True)
class Note:
    """A line for the operator's log."""

    message: str


Effect = (
    StartWorker | ReleaseWorker | StartRun | StopWorker | AskHeartbeat | RunEnded | Settled | HandedOn | Note
)


@dataclass
class PoolCounts:
    timeouts: int = 0  # runs stopped at their timeout
    lost: int = 0  # workers declared lost for want of a heartbeat
    died: int = 0  # workers whose process ended on its own mid-verification
    replaced: int = 0  # fresh workers started in a stopped or dead one's place
    requeued: int = 0  # verifications put back in the queue after their worker ended
    preempted: int = 0  # runs stopped for more urgent work (requeued, rerun from the start)


def render(effects: Sequence[Effect], at: float) -> list[str]:
    """The decision log's lines for `effects` decided at `at` (notes and spans are not decisions)."""
    lines = []
    for e in effects:
        match e:
            case StartRun():
                lines.append(dispatch_line(e, at))
            case StopWorker():
                lines.append(f"{at:.9f} stop {e.worker}: {e.reason}")
            case StartWorker() | ReleaseWorker():
                lines.append(f"{at:.9f} {type(e).__name__} {e.worker}")
            case Settled():
                lines.append(f"{at:.9f} settled {e.task_id}: {type(e.outcome).__name__}")
            case HandedOn():
                lines.append(f"{at:.9f} handed on {e.task.task_id}")
    return lines


def dispatch_line(e: StartRun, at: float) -> str:
    gang = f" + {', '.join(e.gang)}" if e.gang else ""
    return f"{at:.9f} dispatch {e.task.task_id}#{e.task.attempt} -> {e.worker}{gang}"

"""The iteration's events and effects: the words between the iteration core
(`rlsched.core.pipeline.PipelineCore`, sync or async) and its drivers (the Ray one in
`rlsched.job.iterations`, the simulator's `rlsched.sim.rljob.SimJob`, the in-process `rlsched.rl.loop`).

The core knows samples by their request ids, never their tokens; a driver feeds it what happened
(`Started`, `SampleArrived`, `Offered`, `Judged`, `Updated`, `VersionPublished`, `Reloaded`) and
carries out what it decides (`Generate`, `Verify`, `Update`, `Dropped`, `Publish`, `Reload`,
`Committed`), assembling and training with the data it holds when told. `Phases` is a driver's
check that it runs the phases in the order the core asked for them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TypeVar

# -- events -------------------------------------------------------------------------------------
# Values, never changed once made (not frozen: the simulator builds one per sample).


@dataclass(slots=True)
class Started:
    at: float
    iteration: int
    requests: tuple[str, ...]


@dataclass(slots=True)
class Offered:
    """Samples finished outside the job's requests (an endpoint's episodes), with their versions."""

    at: float
    samples: tuple[tuple[str, int], ...]


@dataclass(slots=True)
class SampleArrived:
    at: float
    request_id: str
    version: int


@dataclass(slots=True)
class Judged:
    """A sample's verification settled (a verdict, or a fault that will not be retried)."""

    at: float
    request_id: str


@dataclass(slots=True)
class Updated:
    at: float


@dataclass(slots=True)
class VersionPublished:
    at: float
    version: int


@dataclass(slots=True)
class Reloaded:
    at: float


Event = Started | Offered | SampleArrived | Judged | Updated | VersionPublished | Reloaded

# -- effects ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Verify:
    """Hand these samples to the verifier pool now."""

    request_ids: tuple[str, ...]


@dataclass(slots=True)
class Generate:
    """A pipelined core's word that iteration `iteration`'s requests may go out now (answered with
    `Started`); the sequential core's drivers start the next iteration once the last is committed."""

    iteration: int


@dataclass(slots=True)
class Update:
    """The batch is complete: assemble these samples (whole groups, judged, none older than
    `oldest`) and train on them. A pipelined core has already left out the groups past the
    staleness bound (`Dropped`) and counts the batch's samples by staleness (`staleness`:
    (versions stale, samples))."""

    iteration: int
    request_ids: tuple[str, ...]
    oldest: int
    staleness: tuple[tuple[int, int], ...] = ()


@dataclass(slots=True)
class Dropped:
    """A pipelined core left these groups' samples out: one of each group's samples was generated
    with a version older than `oldest` when the trainer took its next batch."""

    request_ids: tuple[str, ...]
    oldest: int


@dataclass(slots=True)
class Publish:
    version: int


@dataclass(slots=True)
class Reload:
    version: int


@dataclass(slots=True)
class Committed:
    """The iteration is over: its samples were generated with `version`; `generation_s` from its
    start to its last sample."""

    iteration: int
    version: int
    started: float
    generation_s: float


Effect = Verify | Generate | Update | Dropped | Publish | Reload | Committed


_Phase = TypeVar("_Phase", Generate, Update, Publish, Reload, Committed)


class Phases:
    """A driver's record of the phases the core asked for, to run in its own order: `take` checks
    that the next one is the phase the driver is about to run."""

    def __init__(self) -> None:
        self._due: deque[Effect] = deque()

    def ask(self, effect: Effect) -> None:
        self._due.append(effect)

    def take(self, kind: type[_Phase]) -> _Phase:
        due = self._due.popleft() if self._due else None
        if not isinstance(due, kind):
            raise RuntimeError(f"the iteration's core asked for {due}, not {kind.__name__}")  # a driver bug
        return due

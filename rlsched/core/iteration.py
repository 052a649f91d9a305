"""One RL job's iteration as a state core: which samples it waits for, when they go to verification,
when the batch is complete, and the phases after it, in order.

The Ray controller (`actors.controller`), the simulator (`rlsched.sim.rljob`) and the in-process
loop (`rlsched.rl.loop`) drive this class. It knows samples by their request ids, never their
tokens; the driver assembles and trains when told, with the data it holds:

- `Started` sends an iteration's requests out (GENERATING). Each `SampleArrived` is handed to the
  verifier pool at once (`Verify`), or, for the sequential baseline (`overlap` off), all together
  when the last one has arrived. Samples finished outside the job's own requests (an endpoint's
  episodes) join the batch with `Offered` and are judged like the rest.
- Once every sample is in (JUDGING) and judged (`Judged`), the batch is complete: `Update` names its
  samples and the oldest version an update may use (`rlsched.policy.versions`: groups with an older
  sample are dropped). Then `Publish` the next version, `Reload` it on every instance, and
  `Committed`: the record may be written and the next iteration started.
- `batch_state()` is what the verifier pool's dispatch policy reads of the batch: its training
  group's idle cost, the samples still to come, and when generation should end, from how long the
  last iteration generated.

Lifecycle: `IterationPhase` (`rlsched.policy.lifecycle`), each move checked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rlsched.core.trace import Trace
from rlsched.policy.lifecycle import ITERATION_TRANSITIONS, IterationPhase, iteration_transition
from rlsched.policy.verify import BatchId, BatchState
from rlsched.policy.versions import oldest_admissible

_P = IterationPhase


@dataclass(frozen=True)
class IterationParams:
    overlap: bool = True  # verify each sample as it arrives (off: all of them once generation ends)
    cost_rate: float = 1.0  # devices of the training group left idle while the batch is incomplete
    max_staleness: int = 0  # versions a sample may lag the one being trained
    batch_prefix: str = "iter-"  # the batch of iteration i is `{batch_prefix}{i}`
    kind: str = "default"  # the verifier kind its batch states carry


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


class IterationCore:
    def __init__(self, params: IterationParams, version: int = 0) -> None:
        self.params = params
        self.version = version  # the newest published: what the instances hold
        self.generated_with = version  # what this iteration's own requests are generated with
        self.iteration = 0
        self.phase = _P.COMMITTED
        self.started = 0.0
        self.requests: list[str] = []
        self.wanted: set[str] = set()
        self.arrived: dict[str, int] = {}  # request -> the version it was generated with
        self.judged: set[str] = set()
        self.held: list[str] = []  # the sequential baseline's samples, until the last one is in
        self.generation_s: float | None = None  # this iteration's, once every sample is in
        self.last_generation_s: float | None = None  # the last iteration's that generated to the end
        self.unexpected = 0  # arrivals or verdicts for samples this iteration does not wait for
        self._out: list[Effect] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            SampleArrived: self._arrived,
            Judged: self._judged,
            Started: self._started,
            Offered: self._offered,
            Updated: self._updated,
            VersionPublished: self._published,
            Reloaded: self._reloaded,
        }

    def handle(self, event: Event) -> list[Effect]:
        """Take in one event; the effects, in the order they are to be carried out."""
        self._handlers[type(event)](event)
        return self._take()

    @property
    def batch_id(self) -> BatchId:
        """This iteration's batch, as its verifications name it."""
        return BatchId(f"{self.params.batch_prefix}{self.iteration}")

    def batch_state(self) -> BatchState:
        """What the training group of this iteration's batch waits for, as the dispatch policy reads it."""
        last = self.last_generation_s
        return BatchState(
            self.batch_id,
            cost_rate=self.params.cost_rate,
            outstanding=len(self.requests) - len(self.arrived) if self.phase is _P.GENERATING else 0,
            generation_end=None if last is None else self.started + last,
            kind=self.params.kind,
        )

    @property
    def waiting(self) -> bool:
        """Samples are still to arrive or to be judged."""
        return self.phase in (_P.GENERATING, _P.JUDGING)

    def _to(self, phase: IterationPhase) -> None:
        if phase not in ITERATION_TRANSITIONS[self.phase]:
            iteration_transition(self.phase, phase)  # raises, naming the edges allowed
        self.phase = phase

    # -- handlers ---------------------------------------------------------------------------------

    def _started(self, e: Started) -> None:
        if not e.requests:
            raise ValueError(f"iteration {e.iteration} asks for no samples")
        self._to(_P.GENERATING)
        self.iteration, self.started, self.generated_with = e.iteration, e.at, self.version
        self.requests = list(e.requests)
        self.wanted = set(self.requests)
        self.arrived, self.judged, self.held = {}, set(), []
        self.generation_s = None

    def _offered(self, e: Offered) -> None:
        if self.phase is not _P.GENERATING:
            self.unexpected += len(e.samples)
            return
        for rid, version in e.samples:
            if rid not in self.wanted:
                self.requests.append(rid)
                self.wanted.add(rid)
            self._on_arrival(e.at, rid, version)

    def sample_arrived(self, at: float, rid: str, version: int) -> list[Effect]:
        """`handle(SampleArrived(...))` without the event around it (the simulator's per-sample call)."""
        self._on_arrival(at, rid, version)
        return self._take()

    def judged_now(self, at: float, rid: str) -> list[Effect]:
        """`handle(Judged(...))` without the event around it (the simulator's per-sample call)."""
        self._on_verdict(rid)
        return self._take()

    def _arrived(self, e: SampleArrived) -> None:
        self._on_arrival(e.at, e.request_id, e.version)

    def _judged(self, e: Judged) -> None:
        self._on_verdict(e.request_id)

    def _on_arrival(self, at: float, rid: str, version: int) -> None:
        if self.phase is not _P.GENERATING or rid in self.arrived or rid not in self.wanted:
            self.unexpected += 1
            return
        self.arrived[rid] = version
        if self.params.overlap:
            self._out.append(Verify((rid,)))
        else:
            self.held.append(rid)
        if len(self.arrived) == len(self.requests):
            self.generation_s = self.last_generation_s = at - self.started
            self._to(_P.JUDGING)
            if self.held:
                held, self.held = self.held, []
                self._out.append(Verify(tuple(held)))
            self._maybe_complete()

    def _on_verdict(self, rid: str) -> None:
        if rid not in self.arrived or rid in self.judged:
            self.unexpected += 1
            return
        self.judged.add(rid)
        if self.phase is _P.JUDGING:
            self._maybe_complete()

    def _take(self) -> list[Effect]:
        out, self._out = self._out, []
        return out

    def _maybe_complete(self) -> None:
        if self.phase is _P.JUDGING and len(self.judged) == len(self.requests):
            self._to(_P.UPDATING)
            oldest = oldest_admissible(self.version, self.params.max_staleness)
            self._out.append(Update(self.iteration, tuple(self.requests), oldest))

    def _updated(self, e: Updated) -> None:
        self._to(_P.PUBLISHING)
        self._out.append(Publish(self.version + 1))

    def _published(self, e: VersionPublished) -> None:
        self._to(_P.RELOADING)
        self.version = e.version
        self._out.append(Reload(e.version))

    def _reloaded(self, e: Reloaded) -> None:
        self._to(_P.COMMITTED)
        generation_s = self.generation_s if self.generation_s is not None else e.at - self.started
        self._out.append(Committed(self.iteration, self.generated_with, self.started, generation_s))


IterationTrace = Trace[IterationCore, Event, Effect]

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

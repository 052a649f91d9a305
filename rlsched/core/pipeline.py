"""The iteration as a state core, the one every driver runs (the Ray job's `rlsched.job.iterations`, the
simulator's `rlsched.sim.rljob`, `--local`'s `rlsched.rl.loop`), pipelined: generation runs ahead
of training by up to `max_staleness` versions (`mode: async`), judged groups wait in a buffer, and
the trainer takes a batch whenever it is free. `mode: sync` is the same pipeline run zero versions
ahead: a wave goes out once the step before it is committed, and the step takes the whole wave
(`PipelineParams.mode`, the variants below), so that one core serves both modes.

Its events and effects are `rlsched.core.iteration`'s: a driver feeds it `Started`, `SampleArrived`,
`Offered`, `Judged`, `Updated`, `VersionPublished` and `Reloaded`, and carries out `Generate` (the
word that the next iteration's requests may go out), `Verify`, `Update`, `Dropped`, `Publish`,
`Reload` and `Committed`. Two lanes run side by side:

- Generation. Iteration `w`'s requests (its wave) may go out once the instances hold version
  `w - 1 - max_staleness` or newer, so that trained in step `w` its samples are at most
  `max_staleness` versions stale, and while the buffer has room. Each sample is verified as it
  arrives (or, with `overlap` off, once its wave's last sample is in). A GRPO group whose members
  are all in and judged joins the buffer.
- Training. When the trainer is idle and the buffer holds a batch (`batch_groups` groups), it takes
  the oldest groups first (by iteration, then by when they were judged). It waits, though, while a
  group still in flight would be past the bound by the next step (its iteration went out when the
  instances held a version that old): taking newer groups first would only have it dropped. A group
  with any sample past the bound (`rlsched.policy.versions.staleness`
  of its oldest token's version against the version being trained) is dropped whole, since the group
  is its own baseline, and named in a `Dropped` effect. The step updates, publishes (after the reload
  of the version before, so one reload runs at a time) and is `Committed` once every instance
  reloaded; the trainer may start the next step while the instances reload.

Each span a driver records carries the iteration it serves: a generated sample its wave's, an update
its step's. `Committed.started` is the previous commit, so iteration spans tile the timeline and the
steady-state t_iter is the time between commits. The buffer counts groups, never requests in flight;
generation pauses while it is full (it may then pass its size by the groups already in flight).

Sync mode (`PipelineMode.SYNC`) differs in three named variants, and makes the decisions the
sequential core made before it was merged here (issue 42), effect for effect, `Generate` aside
(`tests/unit/test_core_pipeline_sync.py`; the simulator's spans were identical across the change):

- generation runs no version ahead: wave `w` goes out once step `w - 1` is committed, whatever
  `max_staleness` (which still bounds the versions an update keeps: an instance may lag);
- a step's batch is its whole wave, every group of it in the order it went out (samples offered
  while the wave generates included), taken once the last group is judged;
- `Committed` names the version the wave went out with and starts at the wave's start.

Lifecycle: the trainer lane's `TrainerPhase` (`rlsched.policy.lifecycle`), each move checked.
"""

from __future__ import annotations

from bisect import insort
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any

from rlsched.core.iteration import (
    Committed,
    Dropped,
    Effect,
    Event,
    Generate,
    Judged,
    Offered,
    Publish,
    Reload,
    Reloaded,
    SampleArrived,
    Started,
    Update,
    Updated,
    Verify,
    VersionPublished,
)
from rlsched.core.trace import Trace
from rlsched.policy.lifecycle import TRAINER_TRANSITIONS, TrainerPhase, trainer_transition
from rlsched.policy.verify import BatchId, BatchState
from rlsched.policy.versions import PipelineMode, oldest_admissible, pipeline_problem, staleness

_T = TrainerPhase
_NONE_LOW = 2**62  # an empty buffer's oldest version: newer than any
_ARRIVED, _LAST_AT, _MEMBERS = attrgetter("arrived"), attrgetter("last_at"), attrgetter("members")


@dataclass(frozen=True)
class PipelineParams:
    batch_groups: int  # GRPO groups per training step
    group_size: int  # samples per group (a wave's requests come group by group)
    max_staleness: int  # k >= 1: versions a trained sample may lag the version being trained
    buffer_groups: int  # judged groups that may wait for the trainer (at least one batch)
    overlap: bool = True  # verify each sample as it arrives (off: a wave's once its last is in)
    cost_rate: float = 1.0  # devices of the training group left idle while it waits for a batch
    batch_prefix: str = "iter-"  # wave w's batch is `{batch_prefix}{w}`
    kind: str = "default"  # the verifier kind its batch states carry
    mode: PipelineMode = PipelineMode.ASYNC  # sync: no version ahead, a step takes its whole wave

    def __post_init__(self) -> None:
        if self.batch_groups < 1 or self.group_size < 1:
            raise ValueError("a pipeline needs at least one group of at least one sample per batch")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be at least 0, got {self.max_staleness}")
        problem = pipeline_problem(self.mode, self.max_staleness, self.buffer_groups, self.batch_groups)
        if problem is not None:
            raise ValueError(problem)

    @property
    def ahead(self) -> int:
        """Versions generation may run ahead of the trainer: `max_staleness` in async mode, none in sync."""
        return self.max_staleness if self.mode is PipelineMode.ASYNC else 0


class _Group:
    """A group of requests of one wave, from its wave going out until it is buffered and trained
    (a plain class with slots: the simulator makes a million, and a dataclass's `__init__` with
    default factories costs a third more)."""

    __slots__ = ("arrived", "done_at", "judged", "last_at", "low", "members", "of", "seq", "wave")

    def __init__(self, wave: int, members: tuple[str, ...], seq: int, of: _Wave | None = None) -> None:
        self.wave = wave
        self.members = members
        self.seq = (
            seq  # its place among every group sent out (a sync step keeps the order its wave went out in)
        )
        self.arrived: dict[str, int] = {}  # request -> oldest version of its tokens
        self.judged: set[str] | None = None  # made at a many-sample group's first verdict
        self.done_at = 0.0
        self.last_at = 0.0  # when its last sample arrived
        self.low = 0  # the oldest version of its samples, set once it is judged whole and buffered
        self.of = of  # its wave, while the wave generates or judges (none: restored judged)

    def __repr__(self) -> str:
        return f"_Group(wave={self.wave}, members={self.members}, seq={self.seq})"


@dataclass(slots=True)
class _Wave:
    iteration: int
    started: float
    requests: int
    floor: int  # the version every serving instance held when it went out
    open_groups: int  # groups not yet in and judged
    arrived: int = 0
    unjudged: int = 0  # arrived, not yet judged
    held: list[str] = field(default_factory=list)  # `overlap` off: until its last sample is in
    done: list[_Group] = field(default_factory=list)  # sync: its judged groups, until all are


@dataclass(slots=True)
class _Step:
    iteration: int
    oldest: int  # the oldest version any of its samples was generated with
    floor: int  # the oldest version every serving instance held when one of its waves went out
    first_wave_started: float
    last_arrival: float


class PipelineCore:
    def __init__(self, params: PipelineParams, version: int = 0, at: float = 0.0, steps: int = 0) -> None:
        """A pipeline from weight version `version` at time `at`, `steps` steps already committed (a
        resumed job's; the next wave and step are `steps + 1`)."""
        self.params = params
        self.version = version  # the newest published
        self.reloaded = version  # what every serving instance holds
        self.trained = version  # what the trainer holds: the version its next update starts from
        self.trainer = _T.IDLE
        self.reloading = False
        self.next_wave = steps + 1
        self.steps = steps  # steps taken (updates asked for)
        self.committed = steps  # steps committed
        self._offset = version - steps  # step n trains from version n - 1 + offset
        self.last_commit = at
        self.waves: dict[int, _Wave] = {}  # waves with samples still to arrive or be judged
        self.groups: dict[str, _Group] = {}  # request -> its group, until the group is buffered
        self.buffer: list[_Group] = []  # oldest iteration first, then by when judged
        self._buffer_low = _NONE_LOW  # the oldest version in the buffer (none: above any)
        self.buffer_peak = 0
        self.dropped_groups = 0
        self.stale_histogram: Counter[int] = Counter()  # samples trained, by versions stale
        self.unexpected = 0
        self.last_generation_s: float | None = None
        self._wave_started: dict[int, float] = {}
        self._wave_floor: dict[int, int] = {}
        self._seq = 0  # groups sent out so far
        sync = params.mode is PipelineMode.SYNC  # the mode's variants, chosen once
        self._take_batch = self._take_wave if sync else self._take_groups
        self._commit_as = self._commit_sync if sync else self._commit_async
        self._judged_group = self._held_in_wave if sync else self._buffered
        self._announced = False  # a Generate is out and its Started not yet in
        self._running: deque[_Step] = deque()  # steps asked for and not yet committed, in order
        self._out: list[Effect] = []
        self._overlap = params.overlap
        self._handlers: dict[type, Callable[[Any], None]] = {
            SampleArrived: self._arrived,  # bound methods, never lambdas: a deep copy rebinds them
            Judged: self._judged,
            Started: self._started,
            Offered: self._offered,
            Updated: self._updated,
            VersionPublished: self._published,
            Reloaded: self._reloaded,
        }

    def restore(
        self, groups: Sequence[Mapping[str, int]], at: float, dropped_groups: int = 0, buffer_peak: int = 0
    ) -> None:
        """Before `start`: judged groups a resumed job had waiting for the trainer (oldest first), each
        as request -> the oldest version of its tokens, back in the buffer ahead of every new wave, and
        the counters it carried. The staleness bound applies to them as to any group."""
        self.dropped_groups, self.buffer_peak = dropped_groups, buffer_peak
        wave = self.steps  # older than any wave this pipeline sends out
        self._wave_started.setdefault(wave, at)
        self._wave_floor.setdefault(wave, self.reloaded)
        for versions in groups:
            group = _Group(wave, tuple(versions), self._next_seq())
            group.arrived, group.judged, group.done_at = dict(versions), set(versions), at
            group.last_at = at
            self._to_buffer((group,))
        self.buffer_peak = max(self.buffer_peak, len(self.buffer))

    def start(self) -> list[Effect]:
        """The first waves that may go out (those the staleness bound allows before any update), after
        a step on restored groups if they make a batch."""
        self._maybe_update()
        self._maybe_generate()
        return self._take()

    def handle(self, event: Event) -> list[Effect]:
        """Take in one event; the effects, in the order they are to be carried out."""
        self._handlers[type(event)](event)
        return self._take()

    def sample_arrived(self, at: float, rid: str, version: int) -> Sequence[Effect]:
        """`handle(SampleArrived(...))` without the event around it (the simulator's per-sample call;
        no list made where there is no effect)."""
        self._on_arrival(at, rid, version)
        return self._take() if self._out else ()

    def judged_now(self, at: float, rid: str) -> Sequence[Effect]:
        """`handle(Judged(...))` without the event around it (the simulator's per-sample call)."""
        self._on_verdict(at, rid)
        return self._take() if self._out else ()

    def _arrived(self, e: SampleArrived) -> None:
        self._on_arrival(e.at, e.request_id, e.version)

    def _judged(self, e: Judged) -> None:
        self._on_verdict(e.at, e.request_id)

    # -- what drivers read -----------------------------------------------------------------------

    @property
    def iteration(self) -> int:
        """The newest wave sent out."""
        return self.next_wave - 1

    def batch_id(self, wave: int) -> BatchId:
        return BatchId(f"{self.params.batch_prefix}{wave}")

    def wave_of(self, rid: str) -> int:
        group = self.groups.get(rid)
        return group.wave if group is not None else self.iteration

    def batch_states(self) -> tuple[BatchState, ...]:
        """Each wave still waited for, as the verifier pool's dispatch policy reads a batch."""
        last = self.last_generation_s
        return tuple(
            BatchState(
                self.batch_id(w.iteration),
                cost_rate=self.params.cost_rate,
                outstanding=w.requests - w.arrived,
                generation_end=None if last is None else w.started + last,
                kind=self.params.kind,
            )
            for w in self.waves.values()
        )

    @property
    def takes_offers(self) -> bool:
        """Samples finished outside the job's requests may join the newest wave now (`Offered`): while
        it is waited for, and in sync mode only until its last own sample is in."""
        wave = self.waves.get(self.iteration)
        if wave is None:
            return False
        return self.params.mode is not PipelineMode.SYNC or wave.arrived < wave.requests

    @property
    def waiting(self) -> bool:
        """Samples are still to arrive or to be judged."""
        return bool(self.waves)

    # -- generation -------------------------------------------------------------------------------

    def _maybe_generate(self) -> None:
        """Send out every wave the staleness bound and the buffer allow now."""
        p = self.params
        while (
            self.next_wave - 1 + self._offset - p.ahead <= self.reloaded
            and len(self.buffer) < p.buffer_groups
            and not self._announced
        ):
            self._announced = True
            self._out.append(Generate(self.next_wave))

    def _started(self, e: Started) -> None:
        p = self.params
        if not e.requests or len(e.requests) % p.group_size:
            raise ValueError(
                f"iteration {e.iteration} asks for {len(e.requests)} samples, "
                f"not whole groups of {p.group_size}"
            )
        if e.iteration != self.next_wave:
            raise ValueError(f"iteration {e.iteration} started, but the pipeline's next is {self.next_wave}")
        self._announced = False
        self.next_wave += 1
        groups = len(e.requests) // p.group_size
        self.waves[e.iteration] = wave = _Wave(e.iteration, e.at, len(e.requests), self.reloaded, groups)
        self._wave_started[e.iteration] = e.at
        self._wave_floor[e.iteration] = self.reloaded
        size, seq, by_id = p.group_size, self._seq, self.groups
        for i in range(0, len(e.requests), size):
            members = e.requests[i : i + size]
            seq += 1
            group = _Group(e.iteration, members, seq, wave)
            for rid in members:
                by_id[rid] = group
        self._seq = seq
        self._maybe_generate()

    def _to_buffer(self, groups: Sequence[_Group]) -> None:
        """Judged groups join the buffer, kept in (wave, judged at) order: in one extend where they come,
        in order, after every group buffered (the common case, and always so for a sync wave, whose
        groups wait for its last): no search; else each in its place. Each is complete, so the oldest
        version of its tokens no longer changes."""
        buffer, low = self.buffer, self._buffer_low
        last = buffer[-1] if buffer else groups[0]
        wave, at, in_order = last.wave, last.done_at, True
        for g in groups:
            g.low = glow = min(g.arrived.values())
            if glow < low:
                low = glow
            if g.wave < wave or (g.wave == wave and g.done_at < at):
                in_order = False
            wave, at = g.wave, g.done_at
        if in_order:
            buffer.extend(groups)
        else:
            for g in groups:
                insort(buffer, g, key=lambda h: (h.wave, h.done_at))
        self._buffer_low = low

    def _set_buffer(self, groups: list[_Group]) -> None:
        self.buffer = groups
        self._buffer_low = min((g.low for g in groups), default=_NONE_LOW)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _offered(self, e: Offered) -> None:
        """Samples finished outside the job's requests: each its own group in the newest wave (in sync
        mode only while that wave generates: its step takes the wave once every sample is in)."""
        wave = self.waves.get(self.iteration)
        if wave is None or not self.takes_offers:
            self.unexpected += len(e.samples)
            return
        for rid, version in e.samples:
            if rid in self.groups:
                self.unexpected += 1
                continue
            wave.requests += 1
            wave.open_groups += 1
            self.groups[rid] = _Group(wave.iteration, (rid,), self._next_seq(), wave)
            self._on_arrival(e.at, rid, version)

    def _on_arrival(self, at: float, rid: str, version: int) -> None:
        group = self.groups.get(rid)
        if group is None or rid in group.arrived:
            self.unexpected += 1
            return
        group.arrived[rid] = version
        group.last_at = at  # arrivals come in time order
        wave = group.of
        assert wave is not None  # a group still expecting samples has its wave
        wave.arrived += 1
        wave.unjudged += 1
        if self._overlap:
            self._out.append(Verify((rid,)))
        else:
            wave.held.append(rid)
        if wave.arrived == wave.requests:
            self.last_generation_s = at - wave.started
            if wave.held:
                held, wave.held = wave.held, []
                self._out.append(Verify(tuple(held)))

    def _on_verdict(self, at: float, rid: str) -> None:
        groups = self.groups
        group = groups.get(rid)
        if group is None or rid not in group.arrived:
            self.unexpected += 1
            return
        members = group.members
        if len(members) == 1:  # the one-sample group (the simulator's per-sample path): no set, as
            complete = True  # it leaves `groups` now, so that a second verdict finds no group
        else:
            judged = group.judged
            if judged is None:
                judged = group.judged = set()
            elif rid in judged:
                self.unexpected += 1
                return
            judged.add(rid)
            complete = len(judged) == len(members)  # only an arrived sample is judged
        wave = group.of
        assert wave is not None  # an arrived sample's group has its wave
        wave.unjudged -= 1
        if wave.unjudged == 0 and wave.arrived == wave.requests:
            del self.waves[group.wave]
        if complete:
            group.done_at = at
            group.of = None  # no cycle through the wave's list of its judged groups
            wave.open_groups -= 1
            if len(members) == 1:
                del groups[rid]
            else:
                for member in members:
                    del groups[member]
            self._judged_group(group, wave)

    def _buffered(self, group: _Group, wave: _Wave) -> None:
        """Async: a judged group joins the buffer at once, and an idle trainer may take a batch."""
        self._to_buffer((group,))
        if len(self.buffer) > self.buffer_peak:
            self.buffer_peak = len(self.buffer)
        if self.trainer is _T.IDLE:
            self._maybe_update()

    def _held_in_wave(self, group: _Group, wave: _Wave) -> None:
        """Sync: a step takes its whole wave, so its judged groups wait in the wave until the last one
        is judged, then join the buffer together (the same batch, without a look per group)."""
        wave.done.append(group)
        if wave.iteration in self.waves:
            return
        self._to_buffer(wave.done)
        self.buffer_peak = max(self.buffer_peak, len(self.buffer))
        if self.trainer is _T.IDLE:
            self._maybe_update()

    # -- training ---------------------------------------------------------------------------------

    def _to(self, phase: TrainerPhase) -> None:
        if phase not in TRAINER_TRANSITIONS[self.trainer]:
            trainer_transition(self.trainer, phase)  # raises, naming the edges allowed
        self.trainer = phase

    def _maybe_update(self) -> None:
        """An idle trainer takes the oldest batch of groups, the stale ones dropped first."""
        p = self.params
        if self.trainer is not _T.IDLE:
            return
        oldest = oldest_admissible(self.trained, p.max_staleness)
        dropped = [g for g in self.buffer if g.low < oldest] if self._buffer_low < oldest else []
        if dropped:
            self._set_buffer([g for g in self.buffer if g.low >= oldest])
            self.dropped_groups += len(dropped)
            self._out.append(Dropped(_ids(dropped), oldest))
            self._maybe_generate()
        batch = self._take_batch()
        if not batch:
            return
        # the samples' oldest versions (`map`s, not generators: this runs over every group of a step)
        by_version = Counter(chain.from_iterable(map(dict.values, map(_ARRIVED, batch))))
        histogram = Counter({staleness(self.trained, v): n for v, n in by_version.items()})
        self.stale_histogram.update(histogram)
        self.steps += 1
        rids = _ids(batch)
        waves = {g.wave for g in batch}
        self._running.append(
            _Step(
                self.steps,
                min(by_version),
                min(self._wave_floor[w] for w in waves),
                min(self._wave_started[w] for w in waves),
                max(map(_LAST_AT, batch)),
            )
        )
        self._to(_T.UPDATING)
        self._out.append(Update(self.steps, rids, oldest, tuple(sorted(histogram.items()))))
        self._maybe_generate()

    def _waits_for_old_groups(self) -> bool:
        """A group still in flight would be past the bound at the next step, and the batch at hand
        holds groups newer than it."""
        next_oldest = oldest_admissible(self.trained + 1, self.params.max_staleness)
        at_risk = [w.iteration for w in self.waves.values() if w.open_groups and w.floor < next_oldest]
        return bool(at_risk) and self.buffer[self.params.batch_groups - 1].wave > min(at_risk)

    def _updated(self, e: Updated) -> None:
        self.trained += 1
        if self.reloading:
            self._to(_T.UPDATED)  # one reload at a time: this publish waits for it
        else:
            self._publish()

    def _publish(self) -> None:
        self._to(_T.PUBLISHING)
        self._out.append(Publish(self.trained))

    def _published(self, e: VersionPublished) -> None:
        self._to(_T.IDLE)
        self.version = e.version
        self.reloading = True
        self._out.append(Reload(e.version))
        self._maybe_update()  # the trainer may step again while the instances reload

    def _reloaded(self, e: Reloaded) -> None:
        self.reloading = False
        self.reloaded = self.version
        step = self._running.popleft()
        self.committed += 1
        self._out.append(self._commit_as(step))
        self.last_commit = e.at
        if self.trainer is _T.UPDATED:
            self._publish()
        self._maybe_generate()

    def _take(self) -> list[Effect]:
        out, self._out = self._out, []
        return out

    # -- the two modes' variants ----------------------------------------------------------------------

    def _take_groups(self) -> list[_Group]:
        """Async: the oldest `batch_groups` groups of the buffer, once it holds that many, unless a
        group still in flight would be past the bound by the next step. Empty: no batch yet."""
        n = self.params.batch_groups
        if len(self.buffer) < n or self._waits_for_old_groups():
            return []
        batch = self.buffer[:n]
        self._set_buffer(self.buffer[n:])
        return batch

    def _take_wave(self) -> list[_Group]:
        """Sync: the oldest wave's every group (those dropped as stale aside), in the order they went
        out, once the wave's last sample is in and judged. Empty: no batch yet."""
        if not self.buffer or self.buffer[0].wave in self.waves:
            return []
        wave = self.buffer[0].wave
        batch = sorted([g for g in self.buffer if g.wave == wave], key=attrgetter("seq"))
        self._set_buffer([g for g in self.buffer if g.wave != wave])
        return batch

    def _commit_async(self, step: _Step) -> Committed:
        """Async: the step's samples' oldest version; the iteration runs from the commit before it, so
        iteration spans tile the timeline and t_iter is the time between commits."""
        generation_s = step.last_arrival - step.first_wave_started
        return Committed(step.iteration, step.oldest, self.last_commit, generation_s)

    def _commit_sync(self, step: _Step) -> Committed:
        """Sync: the version its wave went out with; the iteration runs from its wave's start."""
        generation_s = step.last_arrival - step.first_wave_started
        return Committed(step.iteration, step.floor, step.first_wave_started, generation_s)


def _ids(groups: list[_Group]) -> tuple[str, ...]:
    return tuple(chain.from_iterable(map(_MEMBERS, groups)))


PipelineTrace = Trace[PipelineCore, Event, Effect]

"""The environment core: agent episodes' execution environments under a placement policy, with
admission by the resource that binds. Events in, effects out, no clock of its own: the simulator
drives it in virtual time (`rlsched.sim.envs`), a runtime driver with the wall clock.

An episode is a loop of rounds: a model call, then a tool call of some tool type, which runs in an
environment of that type (memory M, preparation P). The model calls hold one of the fleet's slots
each; the environments hold memory from the moment their preparation starts until they are released.
Three policies (`EnvPolicy`):

- `resident`: every environment the episode may use is prepared when it is admitted and kept until
  it ends (SPEC section 9: 30 s and 60 GiB-s for three 9 + 1 s rounds of one 2 GiB type);
- `rebuild`: each round's environment is prepared when its tool call arrives (the round waits P)
  and released when the call ends, its files kept outside (36 s, 18 GiB-s);
- `prewarm`: preparation of the predicted tool type starts `lead_s` before the model call is
  expected to end; a wrong prediction is cancelled at once and the right type prepared on demand
  (`E[W] = P - h min(P, L)`; 30 s and 18 GiB-s with exact predictions and L = P).

Admission (`rlsched.policy.environments.admit`): an episode starts while a model slot, and for
`resident` all its environments' memory, fit beside what is held; otherwise it waits, pending with
a reason naming the binding resource. A preparation whose memory does not fit waits for memory (its
wait is exposed). Memory-seconds are reserved GiB x seconds held (`MemoryLedger`).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlsched.policy.environments import (
    Admitted,
    Capacity,
    EnvPolicy,
    MemoryLedger,
    Reservation,
    admit,
    pause_plan,
)
from rlsched.policy.lifecycle import EnvState, env_transition


@dataclass(frozen=True)
class EnvType:
    memory_gib: float
    prepare_s: float  # expected preparation (what prewarm's lead is set against)


@dataclass(frozen=True)
class PauseParams:
    """Pausing an idle resident environment over the model's turn (SPEC section 9): saving takes
    `save_s_per_gib` a GiB, resuming `resume_s`; the memory is free only in between. It is chosen when
    `price_per_gib_s x GiB x seconds freed > transition_cost` (`always`: whenever it frees anything,
    or, with `always` and no prices, every time, to measure what it costs)."""

    save_s_per_gib: float
    resume_s: float
    price_per_gib_s: float | None = None
    transition_cost: float | None = None
    always: bool = False


@dataclass(frozen=True)
class EnvParams:
    policy: EnvPolicy
    types: Mapping[str, EnvType]
    capacity: Capacity
    # prewarm: preparation starts this long before the model call should end (None: each predicted
    # type's own preparation time, L = P, the shortest lead that hides a right prediction's wait)
    lead_s: float | None = 0.0

    def lead_for(self, tool: str) -> float:
        return self.types[tool].prepare_s if self.lead_s is None else self.lead_s

    slots_per_episode: float = 1.0  # model slots an admitted episode reserves (its share of model time)
    pause: PauseParams | None = None  # resident: pause idle environments over model turns where it pays


# -- events ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrived:
    at: float
    episode: str
    tools: tuple[str, ...]  # the tool types it may call (resident prepares them all)


@dataclass(frozen=True)
class ModelCallStarted:
    """A model call began (it holds a slot); it should end at `expected_end`, with a tool call of type
    `predicted` (None: no prediction, or the episode is expected to end)."""

    at: float
    episode: str
    expected_end: float
    predicted: str | None = None


@dataclass(frozen=True)
class ToolCalled:
    """The model call ended with a tool call of type `tool`."""

    at: float
    episode: str
    tool: str


@dataclass(frozen=True)
class Prepared:
    at: float
    env: str


@dataclass(frozen=True)
class Paused:
    """Its memory is saved outside; what it held is free."""

    at: float
    env: str


@dataclass(frozen=True)
class Resumed:
    at: float
    env: str


@dataclass(frozen=True)
class ToolDone:
    """A tool call ended: the one of type `tool` (None: the episode's only running call)."""

    at: float
    episode: str
    tool: str | None = None


@dataclass(frozen=True)
class Ended:
    """The episode's last model call ended without a tool call (or a limit cut it off)."""

    at: float
    episode: str


@dataclass(frozen=True)
class Tick:
    at: float


Event = Arrived | ModelCallStarted | ToolCalled | Prepared | Paused | Resumed | ToolDone | Ended | Tick


# -- effects -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admit:
    episode: str  # its first model call may start


@dataclass(frozen=True)
class Pend:
    episode: str
    resource: str
    reason: str


@dataclass(frozen=True)
class Prepare:
    env: str
    tool: str


@dataclass(frozen=True)
class Cancel:
    env: str  # stop preparing it (a wrong prediction); its memory is free


@dataclass(frozen=True)
class Release:
    env: str


@dataclass(frozen=True)
class Pause:
    env: str
    save_s: float  # what saving it is expected to take


@dataclass(frozen=True)
class Resume:
    env: str


@dataclass(frozen=True)
class RunTool:
    episode: str
    env: str
    waited_s: float  # preparation the tool call waited for (exposed)


Effect = Admit | Pend | Prepare | Cancel | Release | Pause | Resume | RunTool


@dataclass(slots=True)
class _Env:
    name: str
    episode: str
    tool: str
    state: EnvState = EnvState.REQUESTED
    resume_at: float = 0.0  # paused: when to start restoring it (its call's expected start, less the resume)

    def to(self, target: EnvState) -> None:
        self.state = env_transition(self.state, target)


@dataclass(slots=True)
class _Episode:
    name: str
    tools: tuple[str, ...]
    envs: dict[str, _Env] = field(default_factory=dict)  # tool type -> its environment
    # tool calls waiting for their environment: type -> since. A turn's calls to different types run at
    # once, each in its own environment; a type's next call comes after its last one is done
    waiting: dict[str, float] = field(default_factory=dict)
    prewarm: tuple[float, str] | None = None  # (when to start preparing, which type)


@dataclass
class EnvCounts:
    admitted: int = 0
    ended: int = 0
    prepared: int = 0
    cancelled: int = 0
    hits: int = 0  # tool calls that found their environment ready or preparing
    misses: int = 0  # prewarm: the predicted type was wrong
    waited_s: float = 0.0  # exposed preparation waits, summed
    tool_calls: int = 0
    paused: int = 0
    pending_by: Counter[str] = field(default_factory=Counter)  # pending reasons, by resource


class EnvCore:
    def __init__(self, params: EnvParams) -> None:
        self.params = params
        self.episodes: dict[str, _Episode] = {}
        self.envs: dict[str, _Env] = {}
        self.queue: deque[tuple[str, tuple[str, ...]]] = deque()  # episodes waiting for admission
        self.slots_held = 0.0
        self.memory = MemoryLedger()
        self.counts = EnvCounts()
        self._blocked: deque[str] = deque()  # environments whose preparation waits for memory
        self._made = 0
        self._timers: list[tuple[float, str]] = []  # prewarm starts (a heap; stale ones skipped)
        self._resumes: list[tuple[float, str]] = []  # paused environments' resumptions (env names)
        self._now = 0.0
        self._out: list[Effect] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            Arrived: self._arrived,
            ModelCallStarted: self._model_call,
            ToolCalled: self._tool_called,
            Prepared: self._prepared,
            Paused: self._paused,
            Resumed: self._resumed,
            ToolDone: self._tool_done,
            Ended: self._ended,
            Tick: lambda e: None,
        }

    def handle(self, event: Event) -> list[Effect]:
        self._now = event.at
        self._handlers[type(event)](event)
        self._due_prewarms()
        self._due_resumes()
        out, self._out = self._out, []
        return out

    def next_wakeup(self) -> float | None:
        """When a prewarm preparation or a resumption is due to start (the driver sends a `Tick`)."""
        self._drop_stale_timers()
        due = [q[0][0] for q in (self._timers, self._resumes) if q]
        return min(due) if due else None

    def _drop_stale_timers(self) -> None:
        while self._timers:
            at, name = self._timers[0]
            episode = self.episodes.get(name)
            if episode is not None and episode.prewarm is not None and episode.prewarm[0] == at:
                return
            heapq.heappop(self._timers)

    # -- admission ---------------------------------------------------------------------------------

    def _need(self, tools: tuple[str, ...]) -> Reservation:
        memory = sum(self.params.types[t].memory_gib for t in set(tools))
        resident = self.params.policy is EnvPolicy.RESIDENT
        return Reservation(memory_gib=memory if resident else 0.0, slots=self.params.slots_per_episode)

    def _held(self) -> Reservation:
        return Reservation(memory_gib=self.memory.held_gib(), slots=self.slots_held)

    def _arrived(self, e: Arrived) -> None:
        self.queue.append((e.episode, e.tools))
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self.queue:
            name, tools = self.queue[0]
            verdict = admit(self._need(tools), self._held(), self.params.capacity)
            if not isinstance(verdict, Admitted):
                self.counts.pending_by[verdict.resource] += 1
                self._out.append(Pend(name, verdict.resource, verdict.reason))
                return
            self.queue.popleft()
            self.slots_held += self.params.slots_per_episode
            self.counts.admitted += 1
            episode = self.episodes[name] = _Episode(name, tools)
            if self.params.policy is EnvPolicy.RESIDENT:
                for tool in dict.fromkeys(tools):
                    self._prepare(episode, tool)
            self._out.append(Admit(name))

    # -- environments ------------------------------------------------------------------------------

    def _prepare(self, episode: _Episode, tool: str) -> _Env:
        self._made += 1
        env = _Env(f"env-{self._made}", episode.name, tool)
        episode.envs[tool] = env
        self.envs[env.name] = env
        gib = self.params.types[tool].memory_gib
        resident = self.params.policy is EnvPolicy.RESIDENT  # reserved at admission already
        if resident or self.memory.held_gib() + gib <= self._memory_room() + 1e-9:
            self._start_preparing(env)
        else:
            self._blocked.append(env.name)
            self.counts.pending_by["memory"] += 1
        return env

    def _memory_room(self) -> float:
        c = self.params.capacity
        return c.memory_gib - c.template_gib

    def _start_preparing(self, env: _Env) -> None:
        env.to(EnvState.PREPARING)
        self.memory.reserve(env.name, self.params.types[env.tool].memory_gib, self._now)
        self.counts.prepared += 1
        self._out.append(Prepare(env.name, env.tool))

    def _free(self, env: _Env, admit: bool = True) -> None:
        """Its memory back (if it held any), and whatever waited for memory tried again (`admit`:
        and the episodes waiting for admission; an ending episode frees all its environments first)."""
        if env.name in self._blocked:  # it waited for memory it never got
            self._blocked.remove(env.name)
        elif self.memory.holds(env.name):  # not while paused: its memory was free then
            self.memory.release(env.name, self._now)
        del self.envs[env.name]
        self._unblock()
        if admit:
            self._admit_waiting()

    def _unblock(self) -> None:
        """Start the preparations and resumptions that waited for memory, in order, while it fits."""
        while self._blocked:
            head = self.envs[self._blocked[0]]
            if self.memory.held_gib() + self.params.types[head.tool].memory_gib > self._memory_room() + 1e-9:
                break
            self._blocked.popleft()
            if head.state is EnvState.PAUSED:
                self._start_resuming(head)
            else:
                self._start_preparing(head)

    def _release(self, episode: _Episode, env: _Env, admit: bool = True) -> None:
        cancelled = env.state in (EnvState.REQUESTED, EnvState.PREPARING)
        env.to(EnvState.RELEASED)
        del episode.envs[env.tool]
        self._out.append(Cancel(env.name) if cancelled else Release(env.name))
        self.counts.cancelled += cancelled
        self._free(env, admit)

    def _prepared(self, e: Prepared) -> None:
        env = self.envs.get(e.env)
        if env is None or env.state is not EnvState.PREPARING:
            return  # cancelled meanwhile
        env.to(EnvState.READY)
        episode = self.episodes[env.episode]
        if env.tool in episode.waiting:
            self._run(episode, env, e.at - episode.waiting[env.tool])

    def _run(self, episode: _Episode, env: _Env, waited: float) -> None:
        episode.waiting.pop(env.tool, None)
        env.to(EnvState.BUSY)
        self.counts.waited_s += waited
        self._out.append(RunTool(episode.name, env.name, waited))

    # -- pausing -----------------------------------------------------------------------------------

    def _maybe_pause(self, env: _Env, call_expected: float) -> None:
        """Pause an idle environment over the model's turn where it pays (`PauseParams`)."""
        pause = self.params.pause
        assert pause is not None
        gib = self.params.types[env.tool].memory_gib
        gap = call_expected - self._now
        if gap <= 0:
            return
        plan = pause_plan(
            gib, gap, pause.save_s_per_gib, pause.resume_s, pause.price_per_gib_s, pause.transition_cost
        )
        if not (pause.always or (plan.pays if plan.pays is not None else plan.freed_s > 0)):
            return
        env.to(EnvState.PAUSING)
        env.resume_at = call_expected - pause.resume_s
        self.counts.paused += 1
        self._out.append(Pause(env.name, plan.save_s))

    def _paused(self, e: Paused) -> None:
        env = self.envs.get(e.env)
        if env is None or env.state is not EnvState.PAUSING:
            return  # released meanwhile
        env.to(EnvState.PAUSED)
        self.memory.release(env.name, self._now)
        self._unblock()
        self._admit_waiting()
        if env.tool in self.episodes[env.episode].waiting:
            self._resume(env)  # its call came while it was being saved: restored at once
        else:
            heapq.heappush(self._resumes, (max(self._now, env.resume_at), env.name))

    def _due_resumes(self) -> None:
        while self._resumes and self._resumes[0][0] <= self._now + 1e-12:
            _, name = heapq.heappop(self._resumes)
            env = self.envs.get(name)
            if env is not None and env.state is EnvState.PAUSED and name not in self._blocked:
                self._resume(env)

    def _resume(self, env: _Env) -> None:
        """Restore it ahead of its call, when its memory fits; else it waits for memory."""
        if self.memory.held_gib() + self.params.types[env.tool].memory_gib <= self._memory_room() + 1e-9:
            self._start_resuming(env)
        else:
            self._blocked.append(env.name)
            self.counts.pending_by["memory"] += 1

    def _start_resuming(self, env: _Env) -> None:
        env.to(EnvState.RESUMING)
        self.memory.reserve(env.name, self.params.types[env.tool].memory_gib, self._now)
        self._out.append(Resume(env.name))

    def _resumed(self, e: Resumed) -> None:
        env = self.envs.get(e.env)
        if env is None or env.state is not EnvState.RESUMING:
            return
        env.to(EnvState.READY)
        episode = self.episodes[env.episode]
        if env.tool in episode.waiting:
            self._run(episode, env, e.at - episode.waiting[env.tool])

    # -- the episode's rounds ----------------------------------------------------------------------

    def _model_call(self, e: ModelCallStarted) -> None:
        episode = self.episodes[e.episode]
        if self.params.pause is not None and self.params.policy is EnvPolicy.RESIDENT:
            for env in episode.envs.values():
                if env.state is EnvState.IDLE:
                    self._maybe_pause(env, e.expected_end)
        if self.params.policy is EnvPolicy.PREWARM and e.predicted is not None:
            lead = self.params.lead_for(e.predicted)
            episode.prewarm = (max(e.at, e.expected_end - lead), e.predicted)
            heapq.heappush(self._timers, (episode.prewarm[0], episode.name))

    def _due_prewarms(self) -> None:
        while True:
            self._drop_stale_timers()
            if not self._timers or self._timers[0][0] > self._now + 1e-12:
                return
            _, name = heapq.heappop(self._timers)
            episode = self.episodes[name]
            assert episode.prewarm is not None
            _, tool = episode.prewarm
            episode.prewarm = None
            if tool not in episode.envs:
                self._prepare(episode, tool)

    def _tool_called(self, e: ToolCalled) -> None:
        episode = self.episodes[e.episode]
        running = episode.envs.get(e.tool)
        if e.tool in episode.waiting or (running is not None and running.state is EnvState.BUSY):
            raise ValueError(
                f"episode {e.episode} called {e.tool} while its last call there is not done: an "
                "environment runs one call at a time (send its ToolDone first)"
            )
        self.counts.tool_calls += 1
        episode.prewarm = None  # the call came before the lead: prepared on demand below
        for tool, other in list(episode.envs.items()):
            busy = other.state is EnvState.BUSY or tool in episode.waiting  # this turn's other calls
            if tool != e.tool and self.params.policy is EnvPolicy.PREWARM and not busy:
                self.counts.misses += 1  # a wrong prediction: cancelled at once
                self._release(episode, other)
        found = episode.envs.get(e.tool)
        if found is not None:
            self.counts.hits += 1
        env = found if found is not None else self._prepare(episode, e.tool)
        if env.state in (EnvState.READY, EnvState.IDLE):
            self._run(episode, env, 0.0)
            return
        episode.waiting[e.tool] = e.at  # preparing or paused
        if env.state is EnvState.PAUSED and env.name not in self._blocked:
            self._resume(env)  # the call came before its resumption was due

    def _tool_done(self, e: ToolDone) -> None:
        episode = self.episodes[e.episode]
        busy = [v for v in episode.envs.values() if v.state is EnvState.BUSY]
        env = episode.envs[e.tool] if e.tool is not None else busy[0]
        env.to(EnvState.IDLE)
        if self.params.policy is not EnvPolicy.RESIDENT:
            self._release(episode, env)  # its files kept outside; prepared again when needed

    def _ended(self, e: Ended) -> None:
        episode = self.episodes.pop(e.episode)
        self.counts.ended += 1
        self.slots_held -= self.params.slots_per_episode
        for env in list(episode.envs.values()):
            self._release(episode, env, admit=False)
        self._admit_waiting()

"""The environment core's runtime driver: agent episodes' environments as real sandboxed processes,
scheduled by `rlsched.core.envs.EnvCore` against the wall clock (the simulator drives the same core
in virtual time, `rlsched.sim.envs`).

`EnvHost` is a threaded Ray actor that holds environments. An environment of a kind
(`EnvKind`) is a persistent sandbox (`verifiers.sandbox`) running a resident server process:
preparing it fetches its image (a timed wait: there is no registry to pull from here), allocates and
touches `memory_mb` of data (the loaded dataset or index that an idle environment keeps holding),
materializes a workspace in its work directory, and then answers tool calls over the sandbox's
channel. Releasing it saves the work directory outside (the episode's files, restored into the next
environment of that kind) and kills the process. The host samples each live environment's cgroup
(`memory.current`) and integrates it: the measured GiB-seconds reported beside the core's reserved
ones.

`EnvDriver` runs episodes of rounds (a model turn, then a tool call of some kind) through the core:
it turns the core's effects into host calls (`Prepare`, `Cancel`, `Release`, `RunTool`) and the
host's answers, model turns ending, and the core's prewarm timers into events. Model turns here are
timed stand-ins of a given length (the benchmark is about environments; on two cores a real model's
decoding would serialize them); each is announced with the remaining-time estimate (the mean turn
so far) and a prediction of the next tool's kind (the last kind the episode used), so `prewarm`
prepares against a real hit rate below 1.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import random
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import ray

from rlsched.core import envs as ec
from verifiers.sandbox import Sandbox
from verifiers.sandbox_run import Running
from verifiers.sandbox_types import SandboxLimits


@dataclass(frozen=True)
class EnvKind:
    """An environment type that behaves like the chapter's: memory held while idle, a preparation
    about as long as a model turn."""

    memory_mb: int = 256  # the data its resident process holds
    fetch_s: float = 0.6  # its image fetched (a timed wait)
    workspace_mb: int = 8  # files materialized in its work directory
    tool_s: float = 0.2  # a tool call's own work (a timed wait after reading its data)


SERVER = """
import json, os, time
spec = json.loads({spec!r})
started = time.monotonic()
time.sleep(spec["fetch_s"])
data = bytearray(spec["memory_mb"] << 20)
for i in range(0, len(data), 4096):
    data[i] = 1
os.makedirs("workspace", exist_ok=True)
for k in range(spec["workspace_mb"]):
    name = f"workspace/{{k}}.bin"
    if not os.path.exists(name):
        with open(name, "wb") as f:
            f.write(os.urandom(1 << 20))
requests, responses = os.fdopen(3, "rb"), os.fdopen(4, "wb")
responses.write(json.dumps({{"ready_s": time.monotonic() - started}}).encode() + b"\\n")
responses.flush()
for line in requests:
    call = json.loads(line)
    t = time.monotonic()
    total = sum(data[i] for i in range(0, len(data), 1 << 16))
    with open("calls.log", "a") as log:
        log.write(call["tool"] + "\\n")
    calls = len(open("calls.log").read().split())
    time.sleep(max(0.0, spec["tool_s"] - (time.monotonic() - t)))
    responses.write(json.dumps({{"pages": total, "calls": calls}}).encode() + b"\\n")
    responses.flush()
"""


@dataclass
class _Live:
    box: Sandbox
    run: Running | None = None
    episode: str = ""
    kind: str = ""
    cancelled: bool = False
    ready: bool = False  # its server answered: a cancellation now ends it, nothing else will


class EnvHostImpl:
    """Environments on one node (`EnvHost` is this as a threaded Ray actor)."""

    def __init__(self, kinds: Mapping[str, EnvKind], sample_s: float = 0.05) -> None:
        self.kinds = dict(kinds)
        self.live: dict[str, _Live] = {}
        self.made: list[Path] = []  # every sandbox directory this host created
        self.files: dict[tuple[str, str], bytes] = {}  # (episode, kind) -> its work directory, kept
        self.lock = threading.Lock()
        self.saved = threading.Condition(self.lock)
        self._saving: set[tuple[str, str]] = set()  # files being saved: a preparation waits for them
        self._seen: set[str] = set()  # every environment a preparation has registered
        self._cancelled_early: set[str] = set()  # cancellations that overtook their preparation
        self.unsaved: dict[tuple[str, str], str] = {}  # files that could not be kept, and why
        self.gib_s = 0.0
        self.peak_gib = 0.0
        self.measured = False
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, args=(sample_s,), daemon=True)
        self._sampler.start()

    def _sample(self, every_s: float) -> None:
        last = time.monotonic()
        while not self._stop.wait(every_s):
            now = time.monotonic()
            with self.lock:
                runs = [e.run for e in self.live.values() if e.run is not None]
            held = [r.groups.memory_bytes() for r in runs if r.groups is not None]
            known = [b for b in held if b is not None]
            self.measured = self.measured or bool(known)
            gib = sum(known) / (1 << 30)
            self.gib_s += gib * (now - last)
            self.peak_gib = max(self.peak_gib, gib)
            last = now

    def prepare(self, env: str, kind: str, episode: str) -> float | None:
        """Build the environment and wait until its server is ready; its seconds, or None where it
        was cancelled meanwhile (it is then gone)."""
        started = time.monotonic()
        spec = self.kinds[kind]
        with self.lock:
            self._seen.add(env)
            if env in self._cancelled_early:  # the actor is threaded: its cancellation ran first
                self._cancelled_early.discard(env)
                return None
        box = Sandbox.create(persistent=True, work_mb=spec.workspace_mb + 16)
        live = _Live(box, episode=episode, kind=kind)
        with self.lock:
            self.made.append(box.host_dir)
            self.live[env] = live
            self.saved.wait_for(lambda: (episode, kind) not in self._saving)
            archive = self.files.get((episode, kind))
            unsaved = self.unsaved.get((episode, kind))
        if unsaved is not None:  # the episode's files are gone: rebuilding without them would lie
            box.destroy()
            with self.lock:
                self.live.pop(env, None)
            raise RuntimeError(f"episode {episode}'s {kind} environment files were not kept: {unsaved}")
        if archive is not None:
            box.restore_work(archive)
        limits = SandboxLimits(
            timeout_s=3600, cpu_s=3600, memory_mb=spec.memory_mb + 96, file_mb=2,
            work_mb=spec.workspace_mb + 16, open_files=32,
        )  # fmt: skip
        program = SERVER.format(spec=json.dumps(spec.__dict__))
        run = box.start(program, limits=limits, channel=True)
        with self.lock:
            live.run = run
            cancelled = live.cancelled
        ready = None if cancelled else run.receive()
        with self.lock:
            live.ready = ready is not None and not live.cancelled
        if not live.ready:
            self._end(env, keep=False)
            return None
        return time.monotonic() - started

    def call(self, env: str, tool: str) -> dict[str, Any]:
        with self.lock:
            live = self.live[env]
        assert live.run is not None
        if not live.run.send(json.dumps({"tool": tool}).encode()) or (line := live.run.receive()) is None:
            raise RuntimeError(f"environment {env} stopped answering")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def cancel(self, env: str) -> None:
        """Stop preparing it: a preparation under way notices and tears it down. The core cancels
        what it believes is still preparing; the host may have finished meanwhile (its answer not yet
        delivered), and then the cancellation ends the environment itself."""
        with self.lock:
            live = self.live.get(env)
            if live is None:
                if env not in self._seen:
                    self._cancelled_early.add(env)
                return
            live.cancelled = True
            run, ready = live.run, live.ready
        if ready:
            self._end(env, keep=False)
        elif run is not None:
            run.kill()

    def release(self, env: str, keep_files: bool) -> None:
        self._end(env, keep=keep_files)

    def _end(self, env: str, keep: bool) -> None:
        with self.lock:
            live = self.live.pop(env, None)
            if live is None:
                return
            if keep:
                self._saving.add((live.episode, live.kind))
        if live.run is not None:
            live.run.kill()
            with contextlib.suppress(Exception):
                live.run.wait()
        if keep:
            try:
                self.files[(live.episode, live.kind)] = live.box.save_work()
            except (OSError, ValueError) as err:  # over the environment's size, or unreadable
                self.unsaved[(live.episode, live.kind)] = str(err)
            finally:
                with self.lock:
                    self._saving.discard((live.episode, live.kind))
                    self.saved.notify_all()
        live.box.destroy()

    def forget(self, episode: str) -> None:
        """The episode ended: its kept files go."""
        for key in [k for k in self.files if k[0] == episode]:
            del self.files[key]

    def report(self) -> dict[str, Any]:
        leftovers = sorted(p.name for p in self.made if p.exists())
        return {
            "live": sorted(self.live),
            "kept_files": len(self.files),
            "unsaved_files": dict(sorted((f"{e}/{k}", why) for (e, k), why in self.unsaved.items())),
            "measured_gib_s": self.gib_s if self.measured else None,
            "measured_peak_gib": self.peak_gib if self.measured else None,
            "sandbox_dirs": leftovers,  # of those it created, still on disk
            "created": len(self.made),
        }

    def shutdown(self) -> None:
        for env in list(self.live):
            self._end(env, keep=False)
        self.files.clear()
        self._stop.set()


EnvHost = ray.remote(num_cpus=0, max_concurrency=64)(EnvHostImpl)


# -- the driver --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodePlan:
    """An episode's rounds: each a model turn of `turns_s[k]` seconds, then a call of `tools[k]`."""

    name: str
    tools: tuple[str, ...]
    turns_s: tuple[float, ...]


def plan_episodes(
    n: int, kinds: Sequence[str], rounds: int, turn_s: float, stay: float, jitter: float, seed: int
) -> list[EpisodePlan]:
    """`n` episodes: the first tool's kind drawn evenly, each next one the same kind with probability
    `stay`; turns of `turn_s` +- `jitter` (a fraction)."""
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        tools = [rng.choice(list(kinds))]
        while len(tools) < rounds:
            others = [k for k in kinds if k != tools[-1]]
            tools.append(tools[-1] if rng.random() < stay or not others else rng.choice(others))
        turns = tuple(turn_s * (1 + rng.uniform(-jitter, jitter)) for _ in range(rounds))
        plans.append(EpisodePlan(f"ep-{i}", tuple(tools), turns))
    return plans


@dataclass
class DriverRun:
    policy: str
    episodes: int
    wall_s: float
    run_s: list[float]  # per episode, admission to end
    waits: list[float]  # exposed preparation wait per tool call
    reserved_gib_s: float
    peak_envs: int
    hits: int
    tool_calls: int
    predictions_right: int
    predictions: int
    prepared: int
    cancelled: int
    misses: int  # tool calls whose predicted kind was wrong (prewarm)
    pending: dict[str, int] = field(default_factory=dict)
    answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


class EnvDriver:
    """Episodes through the core, environments on the host, model turns on the wall clock."""

    def __init__(self, params: ec.EnvParams, host: Any, first_turn_s: float) -> None:
        self.params, self.host = params, host
        self.core = ec.EnvCore(params)
        self.t0 = time.monotonic()
        self.turn_estimate = [first_turn_s]  # turns seen so far: the remaining-time estimate
        self._timers: list[tuple[float, int, str, str]] = []  # model turns' ends: (at, tie, episode, kind)
        self._background: list[Any] = []  # releases and cancellations, waited for at the end
        self._tie = count()
        self._refs: dict[Any, tuple[str, str]] = {}  # Ray ref -> (what, env or episode)
        self._env_episode: dict[str, str] = {}
        self._envs_live = 0
        self.peak_envs = 0
        self.predictions = self.right = 0
        self.answers: dict[str, list[dict[str, Any]]] = {}  # each episode's tool answers, in order

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self, plans: Sequence[EpisodePlan]) -> DriverRun:
        by_name = {p.name: p for p in plans}
        self.plans, self.round = by_name, dict.fromkeys(by_name, 0)
        self.admitted: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.last_kind: dict[str, str | None] = dict.fromkeys(by_name)
        self.waits: list[float] = []
        kinds = tuple(self.params.types)  # an episode may call any of the job's tools
        events: list[ec.Event] = [ec.Arrived(self.now(), p.name, kinds) for p in plans]
        while len(self.ended) < len(plans):
            for event in events:
                self._apply(event, self.core.handle(event))
            events = self._next_events()
        ray.get(self._background + list(self._refs))
        return self._summary()

    # -- events in ---------------------------------------------------------------------------------

    def _next_events(self) -> list[ec.Event]:
        """Wait for the next thing to happen: a host answer, a model turn's end, a prewarm timer."""
        due = [
            t
            for t in (self._timers[0][0] if self._timers else None, self.core.next_wakeup())
            if t is not None
        ]
        wait_s = max(0.0, min(due) - self.now()) if due else 1.0
        if self._refs:
            ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=wait_s)
        else:
            time.sleep(wait_s)
            ready = []
        events: list[ec.Event] = []
        for ref in ready:
            what, name = self._refs.pop(ref)
            value = ray.get(ref)
            if what == "prepared" and value is not None:
                events.append(ec.Prepared(self.now(), name))
            elif what == "tool":
                self.answers.setdefault(name, []).append(value)
                events.append(ec.ToolDone(self.now(), name))
        while self._timers and self._timers[0][0] <= self.now():
            _, _, episode, kind = heapq.heappop(self._timers)
            events.append(ec.ToolCalled(self.now(), episode, kind))
        wake = self.core.next_wakeup()
        if wake is not None and wake <= self.now():
            events.append(ec.Tick(self.now()))
        return events

    # -- effects out -------------------------------------------------------------------------------

    def _apply(self, event: ec.Event, effects: list[ec.Effect]) -> None:
        if isinstance(event, ec.ToolDone):
            self._tool_done(event.episode)
        for effect in effects:
            if isinstance(effect, ec.Admit):
                self.admitted[effect.episode] = self.now()
                self._model_turn(effect.episode)
            elif isinstance(effect, ec.Prepare):
                episode = self.core.envs[effect.env].episode
                self._env_episode[effect.env] = episode
                self._envs_live += 1
                self.peak_envs = max(self.peak_envs, self._envs_live)
                self._refs[self.host.prepare.remote(effect.env, effect.tool, episode)] = (
                    "prepared",
                    effect.env,
                )
            elif isinstance(effect, ec.Cancel):
                self._envs_live -= 1
                self._background.append(self.host.cancel.remote(effect.env))
            elif isinstance(effect, ec.Release):
                self._envs_live -= 1
                keep = self._env_episode[effect.env] not in self.ended
                self._background.append(self.host.release.remote(effect.env, keep))
            elif isinstance(effect, ec.RunTool):
                self.waits.append(effect.waited_s)
                kind = self.plans[effect.episode].tools[self.round[effect.episode]]
                self._refs[self.host.call.remote(effect.env, kind)] = ("tool", effect.episode)

    def _model_turn(self, episode: str) -> None:
        plan, k = self.plans[episode], self.round[episode]
        now = self.now()
        predicted = self.last_kind[episode] or plan.tools[0]  # the first from the task, then "the same"
        self.predictions += 1
        self.right += predicted == plan.tools[k]
        expected = now + statistics.fmean(self.turn_estimate)
        self._apply_now(ec.ModelCallStarted(now, episode, expected, predicted))
        self.turn_estimate.append(plan.turns_s[k])
        heapq.heappush(self._timers, (now + plan.turns_s[k], next(self._tie), episode, plan.tools[k]))

    def _apply_now(self, event: ec.Event) -> None:
        self._apply(event, self.core.handle(event))

    def _tool_done(self, episode: str) -> None:
        plan = self.plans[episode]
        self.last_kind[episode] = plan.tools[self.round[episode]]
        self.round[episode] += 1
        if self.round[episode] < len(plan.tools):
            self._model_turn(episode)
        else:
            self.ended[episode] = self.now()
            self._apply_now(ec.Ended(self.now(), episode))
            self._background.append(self.host.forget.remote(episode))

    def _summary(self) -> DriverRun:
        c = self.core.counts
        return DriverRun(
            policy=str(self.params.policy),
            episodes=len(self.ended),
            wall_s=self.now(),
            run_s=[self.ended[e] - self.admitted[e] for e in self.ended],
            waits=self.waits,
            reserved_gib_s=self.core.memory.gib_s,
            peak_envs=self.peak_envs,
            hits=c.hits,
            tool_calls=c.tool_calls,
            predictions_right=self.right,
            predictions=self.predictions,
            prepared=c.prepared,
            cancelled=c.cancelled,
            misses=c.misses,
            pending=dict(c.pending_by),
            answers=self.answers,
        )

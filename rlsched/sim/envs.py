"""Agent episodes in virtual time, through the environment core (`rlsched.core.envs`): model calls,
tool calls, preparations, releases and the memory they hold, under each placement policy, at a scale
this machine cannot host (SPEC section 9: 10 tasks a second on 48 cores, 320 model slots, 358 GiB).

Each episode runs `rounds` rounds: a model call of `model_s`, then a tool call of `tool_s` of a tool
type drawn from `mix`; it ends with its last tool call's observation. Each model call comes with a
prediction of the next tool type, right with probability `hit_rate` (otherwise another type); the
core decides what to prepare and when.
Preparations take their type's `prepare_s`; a pause takes what saving the environment takes, and
a resumption `pause.resume_s` (`EnvParams.pause`). Arrivals are every 1/rate seconds (deterministic, as the
chapter's steady state), or all at once when `rate` is 0.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import count

from rlsched.core import envs as ec
from rlsched.policy.environments import EnvPolicy


@dataclass(frozen=True)
class EpisodeSpec:
    rounds: int = 3
    model_s: float = 9.0
    tool_s: float = 1.0
    mix: Mapping[str, float] = field(default_factory=lambda: {"tool": 1.0})  # tool type -> share


@dataclass(frozen=True)
class EnvRun:
    policy: EnvPolicy
    episodes: int  # completed
    task_s: float  # median, arrival to end (admission wait included)
    run_s: float  # median, admission to end
    wait_per_call_s: float  # exposed preparation wait, mean per tool call
    gib_s_per_task: float
    peak_gib: float
    mean_gib: float  # held over the steady window
    throughput: float  # completed episodes per second, over the steady window
    binding: str | None  # the resource pending reasons named most (None: nothing waited)
    hit_rate: float  # tool calls whose environment existed when called
    creations_per_s: float  # preparations per task x throughput
    pauses: int = 0  # idle environments paused over a model turn


def simulate_envs(
    params: ec.EnvParams,
    spec: EpisodeSpec,
    episodes: int,
    rate: float,
    hit_rate: float = 1.0,
    seed: int = 0,
) -> EnvRun:
    rng = random.Random(seed)
    core = ec.EnvCore(params)
    types, weights = list(spec.mix), list(spec.mix.values())
    heap: list[tuple[float, int, ec.Event]] = []
    tie = count()
    arrived: dict[str, float] = {}
    admitted: dict[str, float] = {}
    ended: dict[str, float] = {}
    rounds_left: dict[str, int] = {}
    next_tool: dict[str, str] = {}
    memory: list[tuple[float, float]] = [(0.0, 0.0)]  # (time, GiB held from then on)

    def push(event: ec.Event) -> None:
        heapq.heappush(heap, (event.at, next(tie), event))

    def start_model_call(name: str, at: float) -> None:
        tool = rng.choices(types, weights)[0]
        next_tool[name] = tool
        wrong = [t for t in types if t != tool]
        predicted = tool if rng.random() < hit_rate or not wrong else rng.choice(wrong)
        push(ec.ModelCallStarted(at, name, at + spec.model_s, predicted))
        push(ec.ToolCalled(at + spec.model_s, name, tool))

    for i in range(episodes):
        at = i / rate if rate > 0 else 0.0
        name = f"ep-{i}"
        arrived[name], rounds_left[name] = at, spec.rounds
        push(ec.Arrived(at, name, tuple(types)))
    while heap:
        at, _, event = heapq.heappop(heap)
        if isinstance(event, ec.Ended):
            ended[event.episode] = at
        for effect in core.handle(event):
            if isinstance(effect, ec.Admit):
                admitted[effect.episode] = at
                start_model_call(effect.episode, at)
            elif isinstance(effect, ec.Prepare):
                push(ec.Prepared(at + params.types[effect.tool].prepare_s, effect.env))
            elif isinstance(effect, ec.RunTool):
                push(ec.ToolDone(at + spec.tool_s, effect.episode))
            elif isinstance(effect, ec.Pause):
                push(ec.Paused(at + effect.save_s, effect.env))
            elif isinstance(effect, ec.Resume):
                assert params.pause is not None
                push(ec.Resumed(at + params.pause.resume_s, effect.env))
        if isinstance(event, ec.ToolDone):
            rounds_left[event.episode] -= 1
            if rounds_left[event.episode]:
                start_model_call(event.episode, at)
            else:
                push(ec.Ended(at, event.episode))
        memory.append((at, core.memory.held_gib()))
        wake = core.next_wakeup()
        if wake is not None and (not heap or wake < heap[0][0]):
            push(ec.Tick(wake))
    return _summary(core, params, arrived, admitted, ended, memory)


def _mean_between(memory: list[tuple[float, float]], start: float, end: float) -> float:
    """The time-average of a step function over [start, end]."""
    area = 0.0
    for (t0, gib), (t1, _) in zip(memory, [*memory[1:], (end, 0.0)], strict=True):
        lo, hi = max(t0, start), min(t1, end)
        if hi > lo:
            area += gib * (hi - lo)
    return area / (end - start) if end > start else memory[-1][1]


def _summary(
    core: ec.EnvCore,
    params: ec.EnvParams,
    arrived: dict[str, float],
    admitted: dict[str, float],
    ended: dict[str, float],
    memory: list[tuple[float, float]],
) -> EnvRun:
    done = sorted(ended.values())
    n = len(done)
    steady = done[n // 4 : 3 * n // 4] if n >= 8 else done  # without the ramp-up and the drain
    window = steady[-1] - steady[0] if len(steady) > 1 else 0.0
    throughput = (len(steady) - 1) / window if window else 0.0
    c = core.counts
    pending = c.pending_by.most_common(1)
    return EnvRun(
        policy=params.policy,
        episodes=n,
        task_s=statistics.median(ended[e] - arrived[e] for e in ended),
        run_s=statistics.median(ended[e] - admitted[e] for e in ended),
        wait_per_call_s=c.waited_s / max(c.tool_calls, 1),
        gib_s_per_task=core.memory.gib_s / max(n, 1),
        peak_gib=core.memory.peak_gib,
        mean_gib=_mean_between(memory, steady[0], steady[-1]) if steady else 0.0,
        throughput=throughput,
        binding=pending[0][0] if pending else None,
        hit_rate=c.hits / max(c.tool_calls, 1),
        creations_per_s=c.prepared / max(n, 1) * throughput,
        pauses=c.paused,
    )

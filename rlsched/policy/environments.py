"""The environment models of the seed chapter (sections 11.1-11.2; SPEC section 9): what an agent
task's execution environments cost while the model thinks, when to keep, pause or rebuild one,
when to start preparing the next, and which resource binds first. Pure functions of their inputs,
shared by `rlsched calc env` and the simulator.

- `task_load`: a task of R rounds (a model call, then a tool call) holding its environment
  throughout, at a rate of tasks per second, by Little's law (N = lambda * T): model calls in flight,
  cores busy, environments alive and their memory, against a cluster's cores, model slots and memory;
  the binding resource and the rate it admits.
- `release_plan`: released after each tool call and prepared again, on demand (each round waits for
  the preparation) or just in time (started P seconds before the model call ends).
- `pause_plan`: pausing an environment over a gap G costs its save and its resume; it frees
  M x (G - save - resume) GiB-s, and pays when `price * M * freed > transition cost`.
- `prewarm_wait`: with a prediction of the next tool type right with probability h, preparation P
  and lead L, `E[W] = P - h * min(P, L)`, and what a right prediction holds ready before it is used.
- `template_memory`: N environments made from one template, by how its pages are shared.
- `cost_per_success`: the cost of every attempt, failed ones included, per success.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

GIB = 1 << 30
MIB = 1 << 20


class EnvPolicy(StrEnum):
    """When an episode's environments are prepared and released (`rlsched.core.envs` runs them)."""

    RESIDENT = "resident"  # all prepared at admission, kept until the episode ends
    REBUILD = "rebuild"  # each round's prepared when its tool call arrives, released after it
    PREWARM = "prewarm"  # the predicted type prepared `lead_s` before the model call should end


def _positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")


def _non_negative(**values: float) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be at least 0, got {value}")


@dataclass(frozen=True)
class Capacity:
    """What a cluster gives environments and model calls."""

    cores: float
    slots: float  # model calls the rollout fleet runs at once
    memory_gib: float
    template_gib: float = 0.0  # memory kept aside for a template the environments are made from


@dataclass(frozen=True)
class TaskLoad:
    task_s: float  # one task, end to end
    model_calls_per_s: float
    calls_in_flight: float  # model calls running at once (Little's law)
    cores_busy: float  # tool calls' CPU, on average
    environments: float  # alive at once (Little's law)
    memory_gib: float
    gib_s_per_task: float
    cpu_s_per_task: float
    utilisation: dict[str, float]  # cpu, slots, memory: demand over capacity
    binding: str  # the resource with the highest utilisation
    max_environments: int  # that fit in memory beside the template
    max_rate: float  # tasks per second the binding resource admits


def task_load(
    rounds: int,
    model_s: float,
    tool_s: float,
    env_gib: float,
    rate: float,
    capacity: Capacity,
    tool_cores: float = 1.0,
) -> TaskLoad:
    """A task of `rounds` model-then-tool rounds holding a `env_gib` environment from start to end,
    started `rate` times a second (each tool call keeps `tool_cores` busy)."""
    _positive(rounds=rounds, model_s=model_s, env_gib=env_gib, rate=rate)
    _positive(cores=capacity.cores, slots=capacity.slots, memory_gib=capacity.memory_gib)
    _non_negative(tool_s=tool_s, tool_cores=tool_cores, template_gib=capacity.template_gib)
    task_s = rounds * (model_s + tool_s)
    calls = rate * rounds
    environments = rate * task_s
    cpu_s = rounds * tool_s * tool_cores
    demand = {"cpu": rate * cpu_s, "slots": calls * model_s, "memory": environments * env_gib}
    utilisation = {
        "cpu": demand["cpu"] / capacity.cores,
        "slots": demand["slots"] / capacity.slots,
        "memory": demand["memory"] / capacity.memory_gib,
    }
    binding = max(utilisation, key=lambda k: utilisation[k])
    max_envs = max(0, math.floor((capacity.memory_gib - capacity.template_gib) / env_gib))
    rate_by = {
        "cpu": capacity.cores / cpu_s if cpu_s else math.inf,
        "slots": capacity.slots / (rounds * model_s),
        "memory": max_envs / task_s,
    }
    return TaskLoad(
        task_s=task_s,
        model_calls_per_s=calls,
        calls_in_flight=demand["slots"],
        cores_busy=demand["cpu"],
        environments=environments,
        memory_gib=demand["memory"],
        gib_s_per_task=env_gib * task_s,
        cpu_s_per_task=cpu_s,
        utilisation=utilisation,
        binding=binding,
        max_environments=max_envs,
        max_rate=min(rate_by.values()),
    )


@dataclass(frozen=True)
class ReleasePlan:
    task_s: float
    wait_per_round_s: float  # preparation the model call did not hide
    gib_s_per_task: float
    memory_gib: float  # at the rate, on average
    creations_per_s: float
    cores_busy: float  # tool calls plus preparations


def release_plan(
    rounds: int,
    model_s: float,
    tool_s: float,
    env_gib: float,
    prepare_s: float,
    rate: float,
    just_in_time: bool,
    prepare_cpu_s: float = 0.0,
    tool_cores: float = 1.0,
) -> ReleasePlan:
    """Each round's environment prepared for its tool call and released after it: on demand (the
    round waits `prepare_s`) or just in time (preparation starts `prepare_s` before the model call
    ends, so nothing waits). Either way it is held for preparation plus tool call."""
    _positive(rounds=rounds, model_s=model_s, env_gib=env_gib, rate=rate)
    _non_negative(tool_s=tool_s, prepare_s=prepare_s, prepare_cpu_s=prepare_cpu_s, tool_cores=tool_cores)
    wait = 0.0 if just_in_time else prepare_s
    task_s = rounds * (model_s + wait + tool_s)
    gib_s = rounds * (prepare_s + tool_s) * env_gib
    return ReleasePlan(
        task_s=task_s,
        wait_per_round_s=wait,
        gib_s_per_task=gib_s,
        memory_gib=rate * gib_s,
        creations_per_s=rate * rounds,
        cores_busy=rate * rounds * (tool_s * tool_cores + prepare_cpu_s),
    )


@dataclass(frozen=True)
class PausePlan:
    save_s: float
    freed_s: float  # seconds of the gap the memory is really free
    gib_s_kept: float  # held over the gap without pausing
    gib_s_paused: float  # held over the gap when paused (during save and resume)
    pays: bool | None  # price * M * freed > transition cost (None: no prices given)


def pause_plan(
    env_gib: float,
    gap_s: float,
    save_s_per_gib: float,
    resume_s: float,
    price_per_gib_s: float | None = None,
    transition_cost: float | None = None,
) -> PausePlan:
    """Pausing an environment of `env_gib` over an idle gap of `gap_s`: saving takes `save_s_per_gib`
    a GiB, resuming `resume_s`; the memory is free only in between."""
    _positive(env_gib=env_gib, gap_s=gap_s)
    _non_negative(save_s_per_gib=save_s_per_gib, resume_s=resume_s)
    save_s = env_gib * save_s_per_gib
    freed = max(0.0, gap_s - save_s - resume_s)
    kept = env_gib * gap_s
    pays = None
    if price_per_gib_s is not None and transition_cost is not None:
        pays = price_per_gib_s * env_gib * freed > transition_cost
    return PausePlan(save_s, freed, kept, kept - env_gib * freed, pays)


@dataclass(frozen=True)
class Prewarm:
    expected_wait_s: float  # E[W] = P - h * min(P, L)
    early_gib_s: float  # a ready environment held before its call, per prediction, on average


def prewarm_wait(prepare_s: float, hit_rate: float, lead_s: float, env_gib: float = 0.0) -> Prewarm:
    """Preparation `prepare_s` started `lead_s` before the call, for the tool type predicted right
    with probability `hit_rate` (a wrong one is cancelled at once, the right one prepared on demand)."""
    _non_negative(prepare_s=prepare_s, lead_s=lead_s, env_gib=env_gib)
    if not 0 <= hit_rate <= 1:
        raise ValueError(f"hit_rate must be in [0, 1], got {hit_rate}")
    return Prewarm(
        prepare_s - hit_rate * min(prepare_s, lead_s),
        hit_rate * env_gib * max(0.0, lead_s - prepare_s),
    )


@dataclass(frozen=True)
class TemplateMemory:
    """GiB for N environments made from one template, each way of sharing its pages (the one shared
    template itself not counted; `template_gib` says what it adds)."""

    full_copy_gib: float
    on_demand_gib: float
    shared_gib: float
    shared_hot_gib: float
    template_gib: float


def template_memory(
    environments: int,
    template_mib: float,
    accessed_mib: float,
    dirtied_mib: float,
    overhead_mib: float,
    hot_mib: float,
) -> TemplateMemory:
    """Full copies hold the whole template each; on-demand loading the pages a tool reads; shared
    read-only pages only the dirtied ones; shared with hot pages kept, those too."""
    _positive(environments=environments, template_mib=template_mib)
    _non_negative(
        accessed_mib=accessed_mib, dirtied_mib=dirtied_mib, overhead_mib=overhead_mib, hot_mib=hot_mib
    )
    per = {
        "full": template_mib + overhead_mib,
        "demand": accessed_mib + overhead_mib,
        "shared": dirtied_mib + overhead_mib,
        "hot": dirtied_mib + hot_mib + overhead_mib,
    }
    gib = {k: environments * v * MIB / GIB for k, v in per.items()}
    return TemplateMemory(gib["full"], gib["demand"], gib["shared"], gib["hot"], template_mib * MIB / GIB)


def install_s(fetch_gib: float, install_gib: float, link_gbit: float, cached: bool = False) -> float:
    """At least: the template's bytes over the link (none when cached), then the install's."""
    _positive(link_gbit=link_gbit)
    _non_negative(fetch_gib=fetch_gib, install_gib=install_gib)
    moved = (0.0 if cached else fetch_gib) + install_gib
    return moved * GIB / (link_gbit * 1e9 / 8)


@dataclass(frozen=True)
class CostPerSuccess:
    per_success: float  # every attempt's cost over the successes
    successes_only: float  # what counting only the successes' own cost would say


def cost_per_success(total_cost: float, attempts: int, successes: int, success_cost: float) -> CostPerSuccess:
    _positive(attempts=attempts, successes=successes)
    _non_negative(total_cost=total_cost, success_cost=success_cost)
    if successes > attempts:
        raise ValueError(f"successes ({successes}) cannot exceed attempts ({attempts})")
    return CostPerSuccess(total_cost / successes, success_cost / successes)


# -- admission by the binding resource ---------------------------------------------------------------

RESOURCES = ("memory", "cpu", "slots")
UNITS = {"memory": "GiB of environment memory", "cpu": "cores", "slots": "model slots"}


@dataclass(frozen=True)
class Reservation:
    """What an episode holds while it runs: its environment's memory, CPU and the model's slots."""

    memory_gib: float = 0.0
    cpu: float = 0.0
    slots: float = 0.0

    def amount(self, resource: str) -> float:
        return {"memory": self.memory_gib, "cpu": self.cpu, "slots": self.slots}[resource]

    def plus(self, other: Reservation) -> Reservation:
        return Reservation(self.memory_gib + other.memory_gib, self.cpu + other.cpu, self.slots + other.slots)

    def minus(self, other: Reservation) -> Reservation:
        return Reservation(self.memory_gib - other.memory_gib, self.cpu - other.cpu, self.slots - other.slots)


def _room(capacity: Capacity, resource: str) -> float:
    return {
        "memory": capacity.memory_gib - capacity.template_gib,
        "cpu": capacity.cores,
        "slots": capacity.slots,
    }[resource]


@dataclass(frozen=True)
class SteadyState:
    """Little's law for episodes arriving at `rate` and holding a reservation `seconds` each."""

    episodes: float  # N = lambda * T
    demand: Reservation
    utilisation: dict[str, float]
    binding: str  # the resource with the highest utilisation
    max_rate: float  # what the binding resource admits


def steady_state(rate: float, seconds: float, each: Reservation, capacity: Capacity) -> SteadyState:
    _non_negative(rate=rate, seconds=seconds)
    n = rate * seconds
    demand = Reservation(n * each.memory_gib, n * each.cpu, n * each.slots)
    utilisation = {r: demand.amount(r) / _room(capacity, r) for r in RESOURCES}
    binding = max(RESOURCES, key=lambda r: utilisation[r])
    rates = [_room(capacity, r) / (each.amount(r) * seconds) for r in RESOURCES if each.amount(r) and seconds]
    return SteadyState(n, demand, utilisation, binding, min(rates, default=math.inf))


@dataclass(frozen=True)
class Admitted:
    held: Reservation  # every reservation, this one's included


@dataclass(frozen=True)
class Pending:
    """Not admitted now: the resource that binds, and why, in words (the pending reason)."""

    resource: str
    reason: str


def admit(
    need: Reservation, held: Reservation, capacity: Capacity, forecast: SteadyState | None = None
) -> Admitted | Pending:
    """An episode is admitted while its reservation fits beside the ones held; otherwise it waits,
    its reason naming the resource that binds (the fullest after it) and, with a forecast, what the
    steady state would need of it."""
    after = held.plus(need)
    short = [r for r in RESOURCES if after.amount(r) > _room(capacity, r) + 1e-9]
    if not short:
        return Admitted(after)
    resource = max(short, key=lambda r: after.amount(r) / _room(capacity, r))
    reason = (
        f"{UNITS[resource]}: {held.amount(resource):g} of {_room(capacity, resource):g} reserved, "
        f"the episode needs {need.amount(resource):g}"
    )
    if forecast is not None:
        reason += (
            f"; in steady state {forecast.episodes:g} episodes would need "
            f"{forecast.demand.amount(resource):g} ({100 * forecast.utilisation[resource]:.0f}%)"
        )
    return Pending(resource, reason)


class MemoryLedger:
    """Memory-seconds as admission counts them: reserved GiB x the seconds each reservation is held
    (the clock is the caller's: wall time in the runtime, virtual time in the simulator)."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[float, float]] = {}  # id -> (GiB, since)
        self.gib_s = 0.0
        self.peak_gib = 0.0
        self._held = 0.0

    def reserve(self, key: str, gib: float, at: float) -> None:
        if key in self._open:
            raise ValueError(f"{key} holds a reservation already")
        self._open[key] = (gib, at)
        self._held += gib
        self.peak_gib = max(self.peak_gib, self._held)

    def release(self, key: str, at: float) -> float:
        """Close `key`'s reservation; the GiB-s it held."""
        gib, since = self._open.pop(key)
        self._held -= gib
        held = gib * (at - since)
        self.gib_s += held
        return held

    def holds(self, key: str) -> bool:
        return key in self._open

    def held_gib(self) -> float:
        return self._held

"""Replay a recorded core trace in virtual time: the equivalence check between the drivers.

A Ray driver can record every event it feeds its core, each stamped with its clock, together with
the effects the core returned: the verifier pool (`actors.pool.VerifierPool.record`) and the
cluster scheduler (`actors.cluster.Scheduler.record`). `replay` hands the same events to a copy of
the core as it was when recording began, each at its recorded time on the simulator's clock
(`rlsched.sim.engine.Simulator`), and returns the effects the core decides now. Equal lists mean the
runtime decided nothing outside the core and the core read nothing but its events: the simulator,
driving the same core with drawn durations, makes the runtime's decisions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from rlsched.sim.engine import Simulator


class _Core(Protocol):
    def handle(self, event: Any) -> list[Any]: ...


class Recorded(Protocol):
    """What a driver records: the core when recording began, then (event, effects) per event."""

    @property
    def initial(self) -> Any: ...

    @property
    def steps(self) -> list[tuple[Any, list[Any]]]: ...


@dataclass
class Replayed:
    steps: list[tuple[Any, list[Any]]]
    events: int  # events the simulator ran

    @property
    def effects(self) -> int:
        return sum(len(effects) for _, effects in self.steps)


def replay(trace: Recorded, core: _Core | None = None) -> Replayed:
    """The effects a copy of the trace's initial core returns for each recorded event; or, given
    `core`, the effects that one returns (a core another driver built from the same config, in the
    recorded core's starting state: the equivalence between the drivers)."""
    core = core if core is not None else copy.deepcopy(trace.initial)
    sim = Simulator(0)
    steps: list[tuple[Any, list[Any]]] = []
    first = trace.steps[0][0].at if trace.steps else 0.0
    when = 0.0
    for event, _ in trace.steps:
        # in the recorded order: an event stamped before the one fed ahead of it (a clock read before
        # a driver's lock, a wall clock stepped back) runs with it, as the core took it
        when = max(when, event.at - first)
        sim.at(when, partial(_feed, core, event, steps))
    return Replayed(steps, sim.run())


def _feed(core: _Core, event: Any, steps: list[tuple[Any, list[Any]]]) -> None:
    steps.append((event, core.handle(event)))


def compare(trace: Recorded, replayed: Replayed) -> list[str]:
    """Where the replay departs from the record: one line per differing step (empty: equal)."""
    out = []
    if len(trace.steps) != len(replayed.steps):
        out.append(f"{len(trace.steps)} events recorded, {len(replayed.steps)} replayed")
    for n, ((event, recorded), (_, now)) in enumerate(zip(trace.steps, replayed.steps, strict=False)):
        if recorded != now:
            out.append(f"event {n} ({type(event).__name__} at {event.at:.6f}): {recorded} != {now}")
    return out

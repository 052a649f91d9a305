"""Replay a recorded core trace in virtual time: the equivalence check between the drivers.

A Ray driver can record every event it feeds its core (`actors.pool.VerifierPool.record`), each
stamped with the controller's clock, together with the effects the core returned. `replay` hands
the same events to a copy of the core as it was when recording began, each at its recorded time on
the simulator's clock (`rlsched.sim.engine.Simulator`), and returns the effects the core decides
now. Equal lists mean the runtime decided nothing outside the core and the core read nothing but
its events: the simulator, driving the same core with drawn durations, makes the runtime's
decisions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial

from rlsched.core.verify_pool import Effect, Event, Trace, VerifyPoolCore, render
from rlsched.sim.engine import Simulator


@dataclass
class Replayed:
    steps: list[tuple[Event, list[Effect]]]
    events: int

    @property
    def decisions(self) -> list[str]:
        return [line for event, effects in self.steps for line in render(effects, event.at)]


def replay(trace: Trace) -> Replayed:
    """The effects a copy of the trace's initial core returns for each recorded event."""
    core = copy.deepcopy(trace.initial)
    sim = Simulator(0)
    steps: list[tuple[Event, list[Effect]]] = []
    for event, _ in trace.steps:
        sim.at(event.at - trace.steps[0][0].at, partial(_feed, core, event, steps))
    return Replayed(steps, sim.run())


def _feed(core: VerifyPoolCore, event: Event, steps: list[tuple[Event, list[Effect]]]) -> None:
    steps.append((event, core.handle(event)))


def compare(trace: Trace, replayed: Replayed) -> list[str]:
    """Where the replay departs from the record: one line per differing step (empty: equal)."""
    out = []
    if len(trace.steps) != len(replayed.steps):
        out.append(f"{len(trace.steps)} events recorded, {len(replayed.steps)} replayed")
    for n, ((event, recorded), (_, now)) in enumerate(zip(trace.steps, replayed.steps, strict=False)):
        if recorded != now:
            out.append(f"event {n} ({type(event).__name__} at {event.at:.6f}): {recorded} != {now}")
    return out

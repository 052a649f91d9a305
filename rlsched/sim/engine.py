"""The discrete-event core: a heap of events keyed `(time, priority, seq)`, one seeded generator,
a virtual clock, and a decision log.

Events at the same time run by priority (lower first), then in the order they were scheduled, so a
run is a pure function of its seed and inputs: the same seed gives the same decision log, byte for
byte. `clock` is a zero-argument callable returning seconds, the same protocol as the runtime's
`time.monotonic`, so code written against an injected clock runs unchanged in either.
"""

from __future__ import annotations

import gc
import heapq
import itertools
from collections.abc import Callable

import numpy as np

Action = Callable[[], None]


class EventHandle:
    """A scheduled event, as `at`/`after` return it: its time, and enough to cancel it before it
    runs. (One small object per event: the simulator makes millions.)"""

    __slots__ = ("action", "cancelled", "time")

    def __init__(self, time: float, action: Action) -> None:
        self.time, self.action, self.cancelled = time, action, False

    def cancel(self) -> None:
        self.cancelled = True


_Entry = tuple[float, int, int, EventHandle]  # (time, priority, seq, event): compared in C, seq is unique


class Simulator:
    def __init__(self, seed: int) -> None:
        self.now = 0.0
        self.rng = np.random.default_rng(seed)
        self.decisions: list[str] = []
        self.events_run = 0
        self._heap: list[_Entry] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        """The virtual clock, as a callable (the runtime's clock protocol)."""
        return self.now

    def at(self, time: float, action: Action, priority: int = 0) -> EventHandle:
        if time < self.now:
            raise ValueError(f"cannot schedule at {time}, before now ({self.now})")
        event = EventHandle(time, action)
        heapq.heappush(self._heap, (time, priority, next(self._seq), event))
        return event

    def after(self, delay: float, action: Action, priority: int = 0) -> EventHandle:
        if delay < 0:
            raise ValueError(f"delay must be non-negative, got {delay}")
        return self.at(self.now + delay, action, priority)

    def record(self, line: str) -> None:
        """Append one decision to the log, stamped with the virtual time."""
        self.decisions.append(f"{self.now:.9f} {line}")

    def run(self, until: float | None = None, max_events: int | None = None) -> int:
        """Run events in order until none is left, `until` is passed, or `max_events` have run.

        Python's cyclic garbage collector is paused meanwhile: a large run keeps millions of objects
        alive (spans, the decision log), and repeated full collections over them cost more than the
        simulation itself (a million samples: 61 s with it, 38 s without). Reference counting still
        frees what dies; cycles are collected once the run returns.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(until, max_events)
        finally:
            if was_enabled:
                gc.enable()

    def _run(self, until: float | None, max_events: int | None) -> int:
        ran = 0
        while self._heap and (max_events is None or ran < max_events):
            if until is not None and self._heap[0][0] > until:
                self.now = until
                break
            event = heapq.heappop(self._heap)[3]
            if event.cancelled:
                continue
            self.now = event.time
            event.action()
            ran += 1
        self.events_run += ran
        return ran

    @property
    def pending(self) -> int:
        return sum(not entry[3].cancelled for entry in self._heap)


class Alarm:
    """A core's next wake-up on the simulator: `arm(due)` keeps the earliest time asked for (a core's
    `next_wakeup`), and `action` runs then. One per driven core."""

    __slots__ = ("action", "handle", "sim")

    def __init__(self, sim: Simulator, action: Action) -> None:
        self.sim, self.action = sim, action
        self.handle: EventHandle | None = None

    def arm(self, due: float | None) -> None:
        if due is None or (self.handle is not None and due >= self.handle.time):
            return
        if self.handle is not None:
            self.handle.cancel()
        self.handle = self.sim.at(max(due, self.sim.now), self._ring)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _ring(self) -> None:
        self.handle = None
        self.action()

"""Adaptive verification timeouts per key: long enough for real answers, short enough to stop hangs.

RollPacker's rule (NSDI'26): for each test case, the anchor is the longest time a *correct* run has
taken so far, and a run is stopped at `min(max(floor, factor * anchor), cap)` (their values: factor
1.5, floor 2 s, cap 30 s). With no correct run yet the cap applies. A hard cap bounds everything,
whatever the configuration says. Anchors are kept per key in a sliding window of the most recent
correct runs (so a key's anchor can come down again) and at most `max_keys` keys are remembered.

Pure: the caller reports correct runs and asks for a key's timeout; stopping the run is the
sandbox's job.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeoutParams:
    floor_s: float = 2.0
    factor: float = 1.5
    cap_s: float = 30.0
    hard_cap_s: float = 120.0  # never exceeded, whatever floor, factor and cap say
    window: int = 32  # correct runs remembered per key
    max_keys: int = 100_000

    def __post_init__(self) -> None:
        if not 0 < self.floor_s <= self.cap_s <= self.hard_cap_s:
            raise ValueError("timeouts need 0 < floor_s <= cap_s <= hard_cap_s")
        if self.factor < 1.0:
            raise ValueError("factor must be at least 1 (a timeout below a correct run's time kills answers)")
        if self.window < 1 or self.max_keys < 1:
            raise ValueError("window and max_keys must be at least 1")


def adaptive_timeout(anchor_s: float | None, params: TimeoutParams) -> float:
    """`min(max(floor, factor * anchor), cap)`, or the cap without an anchor; never past the hard cap."""
    if anchor_s is None:
        return min(params.cap_s, params.hard_cap_s)
    return min(max(params.floor_s, params.factor * anchor_s), params.cap_s, params.hard_cap_s)


class TimeoutTable:
    """Per-key anchors (longest recent correct run) and the timeouts they give."""

    def __init__(self, params: TimeoutParams | None = None) -> None:
        self.params = params or TimeoutParams()
        self._runs: OrderedDict[str, deque[float]] = OrderedDict()
        self._anchors: dict[str, float] = {}  # max(self._runs[key]), kept as runs come and go
        self._timeouts: dict[str, float] = {}  # adaptive_timeout(anchor), kept with it
        self._no_anchor = adaptive_timeout(None, self.params)

    def correct_run(self, key: str, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a run's duration must be non-negative, got {seconds}")
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = deque(maxlen=self.params.window)
            if len(self._runs) > self.params.max_keys:
                dropped, _ = self._runs.popitem(last=False)
                del self._anchors[dropped], self._timeouts[dropped]
        else:
            self._runs.move_to_end(key)
        leaving = runs[0] if len(runs) == runs.maxlen else None
        runs.append(seconds)
        anchor = self._anchors.get(key)
        if anchor is None or seconds >= anchor:
            anchor = seconds
        elif leaving is not None and leaving >= anchor:  # the longest run left the window
            anchor = max(runs)
        else:
            return
        self._anchors[key] = anchor
        self._timeouts[key] = adaptive_timeout(anchor, self.params)

    def anchor(self, key: str) -> float | None:
        return self._anchors.get(key)

    def timeout(self, key: str) -> float:
        return self._timeouts.get(key, self._no_anchor)

    @property
    def limit(self) -> float:
        """The time limit of every run: the cap (past it, an answer is wrong, not slow)."""
        return self._no_anchor

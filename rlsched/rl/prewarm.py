"""What `agent.policy: prewarm` needs in a job beside the environment core's rules
(`rlsched.core.envs`): when a model turn should end, which tool kind it will call, and a thread that
wakes the core when a preparation is due.

- `TurnEstimate`: the model-turn estimate, an exponentially weighted mean of the turns this rollout
  saw (wall seconds from a round's submission to the turn's sample). Before the first turn ends it
  is 0: the predicted environment starts preparing with the first model call.
- `predict`: the kind the episode called last; before its first call, its only kind, if it has one
  (otherwise no prediction, and the call prepares on demand, as under `rebuild`).
- `Wakeups`: a daemon thread that calls `fire` when the core's next wake-up is due (`due`, in the
  rollout's clock), re-reading it whenever `poke` says it may have moved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

TURN_WEIGHT = 0.2  # the newest turn's weight in the estimate


class TurnEstimate:
    def __init__(self, weight: float = TURN_WEIGHT) -> None:
        self.weight = weight
        self.seconds = 0.0
        self.turns = 0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            first = self.turns == 0
            self.seconds = seconds if first else self.seconds + self.weight * (seconds - self.seconds)
            self.turns += 1


def predict(last: str | None, kinds: Sequence[str]) -> str | None:
    """The tool kind an episode's next call is expected to use (see the module's docstring)."""
    if last is not None:
        return last
    return kinds[0] if len(kinds) == 1 else None


class Wakeups:
    def __init__(
        self, due: Callable[[], float | None], fire: Callable[[], None], now: Callable[[], float]
    ) -> None:
        self._due, self._fire, self._now = due, fire, now
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="prewarm", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """The next wake-up may have moved (a model call began)."""
        with self._cv:
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._cv:
                if self._closed:
                    return
                at = self._due()
                wait = None if at is None else at - self._now()
                if wait is None or wait > 0:
                    self._cv.wait(wait)
                    continue
            self._fire()  # outside the condition: it feeds the core and starts preparations

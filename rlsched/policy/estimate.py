"""How long a verification still has to run: `E[S - e | S > e]` and quantiles, given elapsed time `e`.

SPEC section 3: with nine verifications of 1 s and one of 100 s the mean is 10.9 s, yet one already
running for 10 s has 90 s left, not 0.9 s. So the estimate is conditional on what has elapsed, and it
is learnt per key: a problem's or test's own history first, then its verifier kind's, then a
configured prior.

- Each key keeps a sliding window of its most recent observations, and at most `max_keys` keys are
  remembered (bounded memory; recent history wins when the policy's outputs change what
  verification costs).
- An observation may be right-censored: a run that timed out or was preempted after `s` seconds says
  only `S > s`. Survival is the Kaplan-Meier product over the window, so censored runs raise the tail
  instead of being counted as short finishes.
- Beyond the longest observation the tail is unknown; there it is taken as a Pareto tail of shape 2,
  which leaves as much again as has elapsed (Lindy's rule), and censored runs join that tail.
- With no usable history the prior is exponential with the configured mean: memoryless, because
  nothing is known yet.

Pure: no clock, no randomness; the caller feeds observations and asks questions.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EstimatorParams:
    window: int = 256  # observations kept per key (and per kind)
    min_observations: int = 3  # a key's own history is used once it has this many, else its kind's
    prior_mean_s: float = 1.0  # exponential prior when a kind has no history yet
    max_keys: int = 100_000  # keys remembered; the least recently observed is forgotten first
    overdue_quantile: float = 0.9  # a run past this quantile of its kind is reported (`running_for`)

    def __post_init__(self) -> None:
        if min(self.window, self.min_observations, self.max_keys) < 1:
            raise ValueError("window, min_observations and max_keys must be at least 1")
        if not self.prior_mean_s > 0:
            raise ValueError("prior_mean_s must be positive")
        if not 0.0 < self.overdue_quantile < 1.0:
            raise ValueError("overdue_quantile must lie strictly between 0 and 1")


@dataclass
class _Survival:
    """Kaplan-Meier survival of one window: S drops at each finish time; `tail` = S after the last."""

    times: list[float]  # distinct observation times, ascending
    surv: list[float]  # S(t) just after times[k]
    area_after: list[float]  # integral of S from times[k] to the last time

    def at(self, t: float) -> float:
        k = bisect.bisect_right(self.times, t)
        return 1.0 if k == 0 else self.surv[k - 1]

    def area_from(self, e: float) -> float:
        """Integral of S(t) dt from e to the last observation time (0 past it)."""
        k = bisect.bisect_right(self.times, e)  # times[k-1] <= e < times[k]
        if k == len(self.times):
            return 0.0
        return self.at(e) * (self.times[k] - e) + self.area_after[k]


def _kaplan_meier(obs: deque[tuple[float, bool]]) -> _Survival:
    finished: dict[float, int] = {}
    censored: dict[float, int] = {}
    for seconds, was_censored in obs:
        bucket = censored if was_censored else finished
        bucket[seconds] = bucket.get(seconds, 0) + 1
    times = sorted(finished.keys() | censored.keys())
    at_risk = len(obs)
    s = 1.0
    surv = []
    for t in times:  # deaths at t count before the runs censored at t leave the risk set
        d = finished.get(t, 0)
        if d:
            s *= 1.0 - d / at_risk
        surv.append(s)
        at_risk -= d + censored.get(t, 0)
    area_after = [0.0] * len(times)
    for k in range(len(times) - 2, -1, -1):
        area_after[k] = area_after[k + 1] + surv[k] * (times[k + 1] - times[k])
    return _Survival(times, surv, area_after)


@dataclass
class _History:
    obs: deque[tuple[float, bool]]
    finished: int = 0  # uncensored observations in the window
    _cache: _Survival | None = field(default=None, repr=False)
    memo: dict[tuple[float, float], float] = field(default_factory=dict, repr=False)  # (p, e) -> answer

    def add(self, seconds: float, censored: bool) -> None:
        if len(self.obs) == self.obs.maxlen and not self.obs[0][1]:
            self.finished -= 1
        self.obs.append((seconds, censored))
        self.finished += not censored
        self._cache = None
        self.memo.clear()

    def survival(self) -> _Survival:
        if self._cache is None:
            self._cache = _kaplan_meier(self.obs)
        return self._cache


@dataclass(frozen=True)
class Estimate:
    remaining_s: float  # E[S - e | S > e]
    source: str  # "key", "kind" or "prior": which history answered


class RemainingTime:
    """Per-key, then per-kind, then prior estimates of a verification's remaining time."""

    def __init__(self, params: EstimatorParams | None = None) -> None:
        self.params = params or EstimatorParams()
        self._by_key: OrderedDict[tuple[str, str], _History] = OrderedDict()
        self._by_kind: dict[str, _History] = {}
        self._overdue: dict[tuple[str, str], dict[str, float]] = {}  # running past the kind's norm

    def running_for(self, kind: str, key: str, run_id: str, elapsed: float) -> None:
        """A run of `key` is still going after `elapsed` seconds (a provisional lower bound, dropped
        when that run is observed). While `key` has too little history of its own, its estimates
        are the kind's conditioned on it: a sibling already running 5 s says this problem is slow."""
        self._overdue.setdefault((kind, key), {})[run_id] = elapsed

    def observe(
        self, kind: str, key: str, seconds: float, censored: bool = False, run_id: str | None = None
    ) -> None:
        """One run: it finished after `seconds`, or (censored) was stopped after `seconds` unfinished."""
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"an observed duration must be non-negative, got {seconds}")
        if run_id is not None and (overdue := self._overdue.get((kind, key))) is not None:
            overdue.pop(run_id, None)
            if not overdue:
                del self._overdue[(kind, key)]
        by_key = self._by_key.get((kind, key))
        if by_key is None:
            by_key = self._by_key[(kind, key)] = _History(deque(maxlen=self.params.window))
            if len(self._by_key) > self.params.max_keys:
                self._by_key.popitem(last=False)
        else:
            self._by_key.move_to_end((kind, key))
        by_kind = self._by_kind.get(kind)
        if by_kind is None:
            by_kind = self._by_kind[kind] = _History(deque(maxlen=self.params.window))
        by_key.add(seconds, censored)
        by_kind.add(seconds, censored)

    def _history(self, kind: str, key: str) -> tuple[_History | None, str]:
        for history, source in ((self._by_key.get((kind, key)), "key"), (self._by_kind.get(kind), "kind")):
            if history is not None and history.finished >= self.params.min_observations:
                return history, source
        return None, "prior"

    def _floor(self, kind: str, key: str, source: str, elapsed: float) -> tuple[float, str]:
        """Without a key history of its own, the longest a sibling run has gone on is a lower bound."""
        if source == "key" or not key or (kind, key) not in self._overdue:
            return elapsed, source
        longest = max(self._overdue[(kind, key)].values())
        return (longest, f"{source}+running") if longest > elapsed else (elapsed, source)

    def estimate(self, kind: str, key: str = "", elapsed: float = 0.0) -> Estimate:
        history, source = self._history(kind, key)
        floor, source = self._floor(kind, key, source, elapsed)
        if history is None:
            return Estimate(self.params.prior_mean_s + (floor - elapsed), source)
        answer = history.memo.get((0.0, floor))  # p = 0 marks the mean
        if answer is None:
            answer = history.memo[(0.0, floor)] = _conditional_remaining(history.survival(), floor)
        return Estimate(answer + (floor - elapsed), source)

    def remaining(self, kind: str, key: str = "", elapsed: float = 0.0) -> float:
        return self.estimate(kind, key, elapsed).remaining_s

    def overdue_after(self, kind: str) -> float:
        """How long a run of `kind` may go before its caller should report it with `running_for`
        (the kind's `overdue_quantile`): the simulator and the Ray pool both ask this."""
        return self.quantile(kind, "", self.params.overdue_quantile)

    def quantile(self, kind: str, key: str = "", p: float = 0.9, elapsed: float = 0.0) -> float:
        """The p-quantile of the remaining time `S - e` given `S > e`."""
        if not 0.0 < p < 1.0:
            raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
        history, source = self._history(kind, key)
        floor, _ = self._floor(kind, key, source, elapsed)
        if history is None:
            return -self.params.prior_mean_s * math.log(1.0 - p) + (floor - elapsed)
        answer = history.memo.get((p, floor))
        if answer is None:
            answer = history.memo[(p, floor)] = _conditional_quantile(history.survival(), p, floor)
        return answer + (floor - elapsed)


def _conditional_remaining(km: _Survival, e: float) -> float:
    s_e = km.at(e)
    if e >= km.times[-1] or s_e <= 0.0:
        return e  # past all history: as much again as has elapsed (Lindy)
    # mass still running after the last time has a Pareto(last, 2) tail: it lasts `last` more on average
    tail = km.surv[-1] * km.times[-1]
    return (km.area_from(e) + tail) / s_e


def _conditional_quantile(km: _Survival, p: float, e: float) -> float:
    s_e = km.at(e)
    last = km.times[-1]
    if e >= last or s_e <= 0.0:
        return e * (1.0 / math.sqrt(1.0 - p) - 1.0)  # a Pareto(e, 2) tail, consistent with Lindy's rule
    target = s_e * (1.0 - p)  # the first time S(t) falls to or below this is the quantile
    for k in range(bisect.bisect_right(km.times, e), len(km.times)):
        if km.surv[k] <= target + 1e-12:
            return km.times[k] - e
    return last * math.sqrt(km.surv[-1] / target) - e  # in the Pareto(last, 2) tail

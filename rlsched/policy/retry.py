"""Retries, decided here and nowhere else: whether another attempt follows a failure, and after how
long. Every kind of work that may fail and pass on a second try asks this one policy:

- verification: a verifier's retryable execution fault (`rlsched.core.verify_pool`), retried
  `grpo.verify_retries` times, back in the queue at once;
- environment set-up: an episode's environment that fails to prepare or whose sandbox fails a tool
  call (`rlsched.rl.agent`), `agent.env_retries` times, at once;
- weight pull: an instance's pull whose bytes or load it cannot confirm (`rlsched.rollout.instance`),
  pulled again `weights.pull_retries` times;
- evaluation: the held-out evaluation losing an instance (`actors.controller`), rerun on the
  replacement `eval.retries` times;
- recovery: the training group failing (`rlsched.job.durability`), rebuilt from the newest checkpoint
  `checkpoint.max_recoveries` times;
- requeue: a supervised job's failed attempt (`rlsched.core.cluster`), readmitted after `base_s`
  doubling up to `max_s`, `limit` times (the admin file's `requeue`).

The failures are counted in a row, from 1; `after(n)` is the wait before attempt n + 1, or None once
the retries are spent. A backoff doubles with each failure (Kueue's requeuing backoff, without its
jitter: each retry here is one process's, there is no herd to spread).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    retries: int | None = 0  # attempts after the first; None: never give up
    base_s: float = 0.0  # the wait after the first failure; doubles with each
    max_s: float = math.inf  # the longest wait

    def __post_init__(self) -> None:
        if self.retries is not None and self.retries < 0:
            raise ValueError(f"retries must be 0 or more (or None: no limit), got {self.retries}")
        if self.base_s < 0 or self.max_s < 0:
            raise ValueError(f"a backoff cannot be negative (base_s {self.base_s}, max_s {self.max_s})")

    def after(self, failures: int) -> float | None:
        """Seconds to wait after the `failures`-th failure in a row before trying again; None: the
        retries are spent, give up."""
        if failures < 1:
            raise ValueError(f"failures counts from 1, got {failures}")
        if self.retries is not None and failures > self.retries:
            return None
        return min(self.max_s, self.base_s * 2.0 ** min(failures - 1, 64))  # 2^64: past any wait

    def gives_up(self, failures: int) -> bool:
        """No attempt follows the `failures`-th failure in a row."""
        return self.after(failures) is None

    @property
    def attempts(self) -> int | None:
        """The attempts in all, the first included (None: unbounded)."""
        return None if self.retries is None else self.retries + 1

"""The verifier pool's core driven in-process: the `--local` loop's verification, with the runtime's rules.

`rlsched run --local` has no worker processes: a sample is verified in the loop's own process the
moment it exists. It still goes through `rlsched.core.verify_pool.VerifyPoolCore`, with one worker
that is always up, so the retry rule, the idempotence of outcomes and the span of every attempt are
the Ray pool's and the simulator's. A `StartRun` runs the verifier at once (`run_verifier`) and its
answer is the `RunFinished`; a fault the core retries comes back as another `StartRun`.

What in-process cannot do: stop a run. A verification's own sandbox bounds untrusted code: the
`code` and `cuda` verifiers stop it at the timeout the core gave its `StartRun` (carried in the
request); the core's own timer has no worker to kill here and never fires, since no `Tick` arrives
while the run holds the process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from rlsched.config_verifier import VerifierConfig
from rlsched.core.verify_pool import VerifyPoolCore
from rlsched.core.verify_pool_io import (
    Effect,
    Event,
    PoolParams,
    RunFinished,
    Settled,
    StartRun,
    StartWorker,
    Submitted,
    WorkerUp,
)
from rlsched.policy.verify import PendingVerification, TaskId, VerifyParams
from verifiers.protocol import UNIT_REWARDS, Outcome, RewardRange, Verifier, VerifyRequest, run_verifier


class LocalPool:
    def __init__(
        self,
        cfg: VerifierConfig,
        retries: int,
        clock: Callable[[], float] = time.monotonic,
        rewards: RewardRange = UNIT_REWARDS,
    ) -> None:
        self.rewards = rewards  # the task's reward range: a verdict outside it is a fault
        params = PoolParams(
            VerifyParams(cfg.dispatch),
            workers=1,
            retries=retries,
            timeouts=cfg.timeout.params(),
            grace_s=cfg.timeout.grace_s,
            name="local",
        )
        self.clock = clock
        self.core = VerifyPoolCore(params, at=clock())
        self._work: dict[TaskId, tuple[Verifier, VerifyRequest]] = {}
        self._settled: dict[TaskId, Outcome] = {}
        for effect in self.core.start():
            assert isinstance(effect, StartWorker)
            self._feed(WorkerUp(clock(), effect.worker))

    def verify(self, task: PendingVerification, verifier: Verifier, request: VerifyRequest) -> Outcome:
        """Judge one sample now, retried as the pool's core decides; its settled outcome."""
        self._work[task.task_id] = (verifier, request)
        self._feed(Submitted(self.clock(), (task,)))
        del self._work[task.task_id]
        return self._settled.pop(task.task_id)

    def _feed(self, event: Event) -> None:
        for effect in self.core.handle(event):
            self._apply(effect)

    def _apply(self, effect: Effect) -> None:
        if isinstance(effect, StartRun):
            verifier, request = self._work[effect.task.task_id]
            start = self.clock()
            timed = replace(
                request, attempt=effect.task.attempt, timeout_s=effect.timeout_s, limit_s=effect.limit_s
            )
            outcome = run_verifier(verifier, timed, self.rewards)
            end = self.clock()
            self._feed(RunFinished(end, effect.task.task_id, effect.task.attempt, outcome, start, end))
        elif isinstance(effect, Settled):
            self._settled[effect.task_id] = effect.outcome

"""A job's verification, as its controller uses it: the verifier pools (one, or a CPU stage that
hands compiled work to a GPU stage: `verifier.gpu_workers`), the task and request each sample
becomes, and the outcomes settled since the last look.

The pools are made by a factory (`PoolFactory`: on Ray, the controller's, of `actors.pool`), so this
bookkeeping is plain Python. A sample's task carries its verifier kind and problem key
(`verify_kind_key`: whose history predicts its time) and the workers it needs at once (a verifier's
`slots`). It waits here until the iteration's core says to verify it (`rlsched.core.iteration.Verify`):
at once, or with the whole batch for the sequential baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from rlsched.config import JobConfig
from rlsched.engine.protocol import RequestId, Sample
from rlsched.job.ports import OnPrepared, PoolPort, Queued
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import BatchId, BatchState, PendingVerification, TaskId
from rlsched.rl.task import TaskProblem, verify_kind_key
from verifiers.loading import VerifierSet, VerifierSpecError
from verifiers.protocol import Outcome, Prepared, Stage, VerifyRequest

P = TypeVar("P", bound=PoolPort)
P_co = TypeVar("P_co", bound=PoolPort, covariant=True)


class PoolFactory(Protocol[P_co]):
    """Makes one stage's pool (on Ray, an `actors.pool.VerifierPool`): a CPU stage hands what it
    prepared to `on_prepared`."""

    def __call__(
        self, stage: Stage, estimator: RemainingTime, on_prepared: OnPrepared | None = None
    ) -> P_co: ...


class JobVerification(Generic[P]):
    """Generic in the pool type, so that the driver that made the pools reads them as its own
    (`pools`: the Ray controller's wait turns on them) without a second list."""

    def __init__(
        self, cfg: JobConfig, verifiers: VerifierSet, make_pool: PoolFactory[P], clock: Callable[[], float]
    ) -> None:
        """`make_pool`: one stage's pool; with `verifier.gpu_workers`, a GPU stage and a CPU stage that
        compiles for it, else one pool that does both."""
        self.cfg, self.verifiers, self.clock = cfg, verifiers, clock
        self.estimator = RemainingTime()  # verification times per problem, learnt as outcomes arrive
        self.gpu_pool: P | None = None
        if cfg.verifier.gpu_workers:  # two-stage verifiers: compile on the CPU pool, run on a GPU worker
            self.gpu_pool = make_pool("gpu", RemainingTime())
        if self.gpu_pool is None:
            self.pool = make_pool("whole", self.estimator)
        else:
            self.pool = make_pool("cpu", self.estimator, self._to_gpu_stage)
        self.pools: list[P] = [p for p in (self.pool, self.gpu_pool) if p is not None]
        self._waiting: dict[str, Queued] = {}

    @property
    def estimators(self) -> list[RemainingTime]:
        """Each stage's, in order (the expected verification time of a problem sums over them)."""
        return [p.estimator for p in self.pools]

    @property
    def idle(self) -> bool:
        return all(p.idle for p in self.pools)

    def kind_key(self, problem: TaskProblem) -> tuple[str, str]:
        return verify_kind_key(problem, self.cfg.verifier.kind)

    def arrived(self, sample: Sample, problem: TaskProblem, iteration: int, batch: BatchId) -> None:
        """A sample of `batch` to verify once the core says so: its task (arriving now) and request."""
        kind, key = self.kind_key(problem)
        task = PendingVerification(
            TaskId(sample.request_id),
            batch,
            self.clock(),
            kind=kind,
            key=key,
            slots=self._slots(problem.verifier),
        )
        request = VerifyRequest(sample.request_id, sample.text, problem.answer)
        self._waiting[sample.request_id] = (task, request, problem.verifier, iteration, b"")

    def verify(self, request_ids: tuple[str, ...]) -> None:
        self.pool.submit_many([self._waiting.pop(rid) for rid in request_ids])

    def dispatch(self, *batches: BatchState) -> None:
        """What the batches still wait for, as of now (the dispatch policy reads it)."""
        for pool in self.pools:
            pool.dispatch(batches)

    def settled(self) -> dict[RequestId, Outcome]:
        """The outcomes settled since the last look (each handed over once)."""
        return {RequestId(t): o for p in self.pools for t, o in p.take_outcomes().items()}

    def shutdown(self) -> None:
        for pool in self.pools:
            pool.shutdown()

    def _slots(self, kind: str | None) -> int:
        """Workers one verification of this kind needs at once (a verifier's `slots`, default 1);
        a kind that does not load needs one, and its worker reports the INPUT fault."""
        try:
            return max(1, int(getattr(self.verifiers.get(kind), "slots", 1)))
        except VerifierSpecError:
            return 1

    def _to_gpu_stage(
        self,
        task: PendingVerification,
        request: VerifyRequest,
        kind: str | None,
        iteration: int,
        prepared: Prepared,
    ) -> None:
        assert self.gpu_pool is not None
        self.gpu_pool.submit(task, request, kind, iteration, prepared.payload)

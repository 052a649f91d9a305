"""The job as its iteration driver (`rlsched.job.iterations`) sees it: the parts it carries effects
out on, each through the few calls it makes, and the calls it makes back to the job. Ports, so that
the driver and the producers (`rlsched.job.arrivals`) never import what implements them: on Ray,
`actors.controller.JobController` holds the training group, the rollout fleet, the verifier pools,
the cluster's orders and the endpoint's link (`actors/`), and `wait` is one turn of `ray.wait`
(`actors.waits.step`). What crosses a port is plain data, or a reference the driver only hands back
(a Ray call in flight, a published version).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from rlsched.config import JobConfig
from rlsched.core.fleet_io import FleetCounts
from rlsched.core.verify_pool_io import PoolCounts
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample
from rlsched.metrics.spans import Span
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import BatchId, BatchState, PendingVerification, TaskId
from rlsched.rl.grpo import LossStats
from rlsched.rl.task import TaskProblem
from rlsched.rl.update import TrainItem
from verifiers.protocol import Outcome, Prepared, VerifyRequest

# a verification queued for a pool: its task, request, verifier kind, iteration and the payload a
# CPU stage prepared for a GPU stage (empty for a first stage)
Queued = tuple[PendingVerification, VerifyRequest, str | None, int, bytes]
# where a CPU stage's prepared work goes next: (task, request, kind, iteration, what it prepared)
OnPrepared = Callable[[PendingVerification, VerifyRequest, "str | None", int, Prepared], None]


class Published(Protocol):
    """A version the training group has published (`actors.trainer.PublishedVersion`)."""

    @property
    def version(self) -> int: ...


class FleetPort(Protocol):
    """The rollout fleet (`actors.fleet.Fleet`): its requests, its streams and its reloads."""

    @property
    def counts(self) -> FleetCounts: ...
    @property
    def reload_done(self) -> bool: ...
    def begin(self, iteration: int, requests: Sequence[GenerationRequest]) -> None: ...
    def tick(self) -> None: ...
    def next_event_in(self) -> float | None: ...
    def waitables(self) -> list[Any]: ...
    def on_ready(self, ref: Any) -> list[tuple[str, Sample]]: ...
    def publish(self, published: Any) -> None: ...  # a `Published` that `Job.publish` returned
    def reload_begin(self, hold: Sequence[str] = ()) -> None: ...


class PoolPort(Protocol):
    """A verifier pool (`actors.pool.VerifierPool`), one stage of a job's verification."""

    estimator: RemainingTime

    @property
    def counts(self) -> PoolCounts: ...
    @property
    def idle(self) -> bool: ...
    def submit(
        self,
        task: PendingVerification,
        request: VerifyRequest,
        kind: str | None,
        iteration: int,
        payload: bytes,
    ) -> None: ...
    def submit_many(self, items: Sequence[Queued]) -> None: ...
    def dispatch(self, batches: tuple[BatchState, ...]) -> None: ...
    def take_outcomes(self) -> dict[TaskId, Outcome]: ...
    def shutdown(self) -> None: ...


class TrainingPort(Protocol):
    """The training group (`actors.trainer.TrainingGroup`): an update started, then its figures."""

    def update_begin(self, items: Sequence[TrainItem]) -> list[Any]: ...
    def update_end(self, refs: list[Any]) -> tuple[LossStats, float, float]: ...


class OrdersPort(Protocol):
    """The cluster scheduler's orders and `rlsched scale`'s commands (`actors.orders.Orders`)."""

    def poll(self) -> None: ...
    def stranded(self, iteration: int, warned: bool) -> bool: ...


class VerificationPort(Protocol):
    """A job's verification (`rlsched.job.verification.JobVerification`), as the driver uses it."""

    @property
    def idle(self) -> bool: ...
    def arrived(self, sample: Sample, problem: TaskProblem, iteration: int, batch: BatchId) -> None: ...
    def verify(self, request_ids: tuple[str, ...]) -> None: ...
    def dispatch(self, *batches: BatchState) -> None: ...
    def settled(self) -> dict[RequestId, Outcome]: ...


class EndpointPort(Protocol):
    """The OpenAI endpoint's part of a job (`actors.endpoint_link.EndpointLink`)."""

    def offer(
        self, verification: VerificationPort, wave: int, batch: BatchId
    ) -> tuple[tuple[str, int], ...]: ...
    def reward(self, outcomes: dict[RequestId, Outcome]) -> dict[str, int]: ...
    def take(
        self, iteration: int, oldest: int
    ) -> tuple[list[TrainItem], list[tuple[str, str]], dict[str, int]]: ...


class Job(Protocol):
    """The job's parts and bookkeeping the driver carries effects out on, and its calls back."""

    cfg: JobConfig
    clock: Callable[[], float]
    log: Callable[[str], None]
    spans: list[Span]
    attempt: int

    @property
    def fleet(self) -> FleetPort: ...
    @property
    def orders(self) -> OrdersPort: ...
    @property
    def verification(self) -> VerificationPort: ...
    @property
    def group(self) -> TrainingPort: ...
    @property
    def endpoint(self) -> EndpointPort | None: ...

    def wait(self, others: Iterable[Any], on_ready: Callable[[Any], None], timeout_s: float) -> None:
        """Block until a verifier pool's call or one of `others` is done, or `timeout_s` passes; hand
        each finished one of `others` to `on_ready`."""
        ...

    def publish(self, iteration: int, version: int) -> Published: ...

    def held(self, version: int) -> list[str]: ...

    def reload_ended(self, failures_before: int, version: int) -> None: ...

    def record_extra(self, stats: LossStats) -> dict[str, Any]: ...

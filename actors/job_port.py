"""The job as the iteration driver (`actors.iterations`) sees it: the controller's actors it carries
effects out on and the four calls it makes back (`actors.controller.JobController` is one). A port,
so that the driver never imports the controller that builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from actors.endpoint_link import EndpointLink
from actors.fleet import Fleet
from actors.orders import Orders
from actors.trainer import PublishedVersion, TrainingGroup
from actors.verification import JobVerification
from rlsched.config import JobConfig
from rlsched.metrics.spans import Span
from rlsched.rl.grpo import LossStats


class Job(Protocol):
    """The job's actors and bookkeeping the driver carries effects out on (`actors.controller`)."""

    cfg: JobConfig
    clock: Callable[[], float]
    log: Callable[[str], None]
    spans: list[Span]
    attempt: int
    fleet: Fleet
    orders: Orders
    verification: JobVerification
    group: TrainingGroup
    endpoint: EndpointLink | None

    def publish(self, iteration: int, version: int) -> PublishedVersion: ...

    def held(self, version: int) -> list[str]: ...

    def reload_ended(self, failures_before: int, version: int) -> None: ...

    def record_extra(self, stats: LossStats) -> dict[str, Any]: ...

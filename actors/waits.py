"""One turn of a driver's wait over Ray: block until a verifier pool's call or another reference (a
generation stream, a weight pull, a rank's update) is done, or a pool's next timer is due; then let
each pool's timers fire and hand every finished reference to its owner. The iteration driver's loop
(`rlsched.job.iterations`) and a pool's `drain` both turn on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import ray


class Pool(Protocol):
    """What the wait asks of a verifier pool (`actors.pool.VerifierPool`)."""

    def waitables(self) -> list[Any]: ...
    def wait_s(self, limit_s: float) -> float: ...
    def watch(self) -> None: ...
    def owns(self, ref: Any) -> bool: ...
    def on_ready(self, ref: Any) -> None: ...


def step(
    pools: Sequence[Pool],
    others: Iterable[Any] = (),
    on_other: Callable[[Any], None] | None = None,
    timeout_s: float = 0.5,
) -> None:
    """One turn of a loop that waits on verifier pools (and on `others`, e.g. generation streams):
    block until something is done, a pool's next timer is due, or `timeout_s` passes; let each pool's
    timers fire; then hand every finished call to its pool, and each finished one of `others` to
    `on_other`, in the order Ray returns them."""
    refs = [*others, *(ref for pool in pools for ref in pool.waitables())]
    if not refs:
        return
    wait = min([timeout_s, *(pool.wait_s(timeout_s) for pool in pools)])
    ray.wait(refs, num_returns=1, timeout=wait)
    for pool in pools:
        pool.watch()  # timeouts, heartbeats, overdue runs
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    for ref in ready:
        owner = next((pool for pool in pools if pool.owns(ref)), None)
        if owner is not None:
            owner.on_ready(ref)
        elif on_other is not None:
            on_other(ref)

"""Durability decisions, pure: the contiguous durable watermark of asynchronous uploads, the cost of
committing every k requests, when a checkpoint is due, which checkpoints may be pruned, and where a
resumed job starts (SPEC section 6; the seed's chapter 11.5.1); and how long a supervised job that
failed waits before it is admitted again, or whether it is parked (`requeue_delay`).

The watermark is the highest round r such that every round up to r is durable. An upload that
succeeds out of order does not move it: round 3 uploaded while round 2 failed leaves the job durable
only through round 1, because a restart from round 3's copy would need round 2's records too, and a
restart from round 1 must not find round 3 claiming to be the newest. A checkpoint is pruned only
behind the watermark, and never the newest durable one.

The commit model: n sequential requests of `request_s` each, a commit every k of them costing
`fixed_s + per_record_s * k`. Committing more often costs more time but loses less work on a crash:
the redo is at most the k requests since the last commit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from rlsched.policy.retry import RetryPolicy


class Upload(StrEnum):
    """Where a round's asynchronous upload stands."""

    PENDING = "pending"  # saved here, not yet (or still being) copied
    DONE = "done"  # copied and verified at the second location
    FAILED = "failed"  # the copy failed; the round is not durable until it is retried and done


def watermark(rounds: Mapping[int, Upload], floor: int = 0) -> int:
    """The contiguous durable watermark: the highest round r with every round from `floor + 1` to r
    DONE (`floor` when the first is not). Rounds are consecutive iterations or checkpoint numbers;
    a round absent from `rounds` counts as not durable."""
    mark = floor
    while rounds.get(mark + 1) is Upload.DONE:
        mark += 1
    return mark


def durable_checkpoint(saved: Iterable[int], uploads: Mapping[int, Upload] | None) -> int | None:
    """The newest checkpoint a resume may trust: with uploads, the newest one whose upload and every
    earlier one's are done (the watermark over the checkpoints in order); without, the newest saved."""
    ordered = sorted(saved)
    if not ordered:
        return None
    if uploads is None:
        return ordered[-1]
    rounds = {i + 1: uploads.get(c, Upload.PENDING) for i, c in enumerate(ordered)}
    mark = watermark(rounds)
    return ordered[mark - 1] if mark else None


def prunable(saved: Iterable[int], durable: int | None, keep: int) -> list[int]:
    """Checkpoints that may be deleted: older than the newest durable one, beyond the `keep` newest.
    Nothing at or ahead of the watermark ever goes (an upload in flight may still fail)."""
    if durable is None:
        return []
    behind = sorted(c for c in saved if c < durable)
    room = max(keep - 1, 0)  # the durable one itself counts towards `keep`
    return behind[: max(len(behind) - room, 0)]


def checkpoint_due(iteration: int, every: int, last_iteration: bool) -> bool:
    """A checkpoint after this committed iteration: every `every` (0: never on a schedule) and after
    the last one, so a finished or stopped job always resumes from where it ended."""
    return last_iteration or (every > 0 and iteration % every == 0)


@dataclass(frozen=True)
class CommitCost:
    every: int  # requests per commit
    commits: int
    overhead_s: float  # total time spent committing
    total_s: float  # requests plus commits, sequentially
    redo_max_s: float  # work lost to a crash just before a commit: at most `every` requests


def commit_cost(
    requests: int, request_s: float, fixed_s: float, per_record_s: float, every: int
) -> CommitCost:
    """Sequential requests with a commit of `fixed_s + per_record_s * records` every `every` requests
    (SPEC: 100 x 200 ms, 8 ms + 2 ms per record: every 1 -> 1,000 ms, 21 s, redo 0.2 s; every 10 ->
    280 ms, 20.28 s, redo 2 s)."""
    if requests < 1 or every < 1:
        raise ValueError("requests and every must be at least 1")
    if min(request_s, fixed_s, per_record_s) < 0:
        raise ValueError("times cannot be negative")
    commits = math.ceil(requests / every)
    overhead = commits * fixed_s + requests * per_record_s
    return CommitCost(
        every, commits, overhead, requests * request_s + overhead, min(every, requests) * request_s
    )


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed job starts: after `iteration` (0: from the start), from that checkpoint; the
    committed iterations after it are redone (their records kept aside, their work counted twice)."""

    iteration: int
    checkpoint: int | None
    redone: tuple[int, ...]


def resume_point(committed: Iterable[int], durable: int | None) -> ResumePoint:
    """Resume from the newest durable checkpoint; iterations committed after it lost their training
    state with the crash and are run again."""
    start = durable or 0
    return ResumePoint(start, durable, tuple(sorted(i for i in committed if i > start)))


def requeue_delay(failures: int, base_s: float, max_s: float, limit: int | None) -> float | None:
    """Seconds a job waits after its `failures`-th failure before it may be admitted again: `base_s`,
    doubling with each failure, at most `max_s` (`rlsched.policy.retry`). None: the job failed more
    than `limit` times and is parked until someone looks at it."""
    return RetryPolicy(limit, base_s, max_s).after(failures)

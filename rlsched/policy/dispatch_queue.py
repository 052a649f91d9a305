"""The pending verifications kept in the order `decide` dispatches them, updated as things change.

`decide(snapshot, now, params)` is the definition: it sorts every pending verification on every call,
which is right for a handful of workers and wrong for a queue of ten thousand behind 256 workers
(O(pending) per freed worker). Where a policy's order does not depend on the clock (`fifo`, `sjf`,
`lrpt`, and `distrs` while a single batch is queued, where latest-start order is longest planned
time first) this queue gives the same order incrementally: verifications that share a verifier
kind, key and elapsed time share an estimate, so they form one group in arrival order, and a heap
holds each group's head under the policy's key. When the estimator learns about a key, only the
groups whose estimate can have changed are re-keyed. With several batches queued under `distrs` the
order depends on the batches' predicted completions, which move with time: `needs_decide` says so
and the caller asks `decide` with the full snapshot (`tasks()`). Equivalence with `decide` is a
property test.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from dataclasses import dataclass, field

from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import BatchId, DispatchPolicy, PendingVerification, TaskId, VerifyParams

_Group = tuple[str, str, float]  # (kind, key, elapsed): verifications that share one estimate


@dataclass
class _Members:
    tasks: list[PendingVerification] = field(default_factory=list)  # sorted by (arrival, task id)
    primary: float = 0.0
    version: int = 0


class DispatchQueue:
    def __init__(self, params: VerifyParams, estimator: RemainingTime | None = None) -> None:
        self.params, self.estimator = params, estimator
        self._groups: dict[_Group, _Members] = {}
        self._heap: list[tuple[float, float, str, _Group, int]] = []
        self._by_id: dict[TaskId, PendingVerification] = {}
        self._batches: Counter[BatchId] = Counter()
        self._fallback: dict[str, set[_Group]] = {}  # per kind: groups estimated from the kind or prior
        self._of_key: dict[tuple[str, str], set[_Group]] = {}  # (kind, key) -> its groups (elapsed differ)

    def __len__(self) -> int:
        return len(self._by_id)

    def tasks(self) -> tuple[PendingVerification, ...]:
        """Every pending verification, oldest first (for a snapshot)."""
        return tuple(self._by_id.values())

    @property
    def needs_decide(self) -> bool:
        """True when the order depends on the clock: `distrs` with more than one batch queued."""
        return self.params.policy is DispatchPolicy.DISTRS and len(self._batches) > 1

    def _group_of(self, task: PendingVerification) -> _Group:
        if self.params.policy is DispatchPolicy.FIFO:
            return ("", "", 0.0)  # one group: arrival order is the whole order
        return (task.kind, task.key, task.elapsed)

    def _primary(self, group: _Group) -> float:
        kind, key, elapsed = group
        est, policy = self.estimator, self.params.policy
        if policy is DispatchPolicy.FIFO or est is None:
            return 0.0
        if est.estimate(kind, key, elapsed).source != "key":
            self._fallback.setdefault(kind, set()).add(group)
        else:
            self._fallback.get(kind, set()).discard(group)
        match policy:
            case DispatchPolicy.SJF:
                return est.remaining(kind, key, elapsed)
            case DispatchPolicy.LRPT:
                return -est.remaining(kind, key, elapsed)
            case _:  # distrs, one batch: the longest planned time has the earliest latest start
                return -est.quantile(kind, key, self.params.quantile, elapsed)

    def _push_head(self, group: _Group, members: _Members) -> None:
        members.version += 1
        head = members.tasks[0]
        heapq.heappush(self._heap, (members.primary, head.arrival, head.task_id, group, members.version))

    def push(self, task: PendingVerification) -> None:
        if task.task_id in self._by_id:
            raise ValueError(f"verification {task.task_id} is already queued")
        group = self._group_of(task)
        members = self._groups.get(group)
        if members is None:
            members = self._groups[group] = _Members()
            members.primary = self._primary(group)
            self._of_key.setdefault(group[:2], set()).add(group)
        order = (task.arrival, task.task_id)
        last = members.tasks[-1] if members.tasks else None
        if last is None or (last.arrival, last.task_id) <= order:
            members.tasks.append(task)
        else:  # out of arrival order (e.g. a batch held back by the sequential baseline): find its place
            at = bisect.bisect_right(members.tasks, order, key=lambda t: (t.arrival, t.task_id))
            members.tasks.insert(at, task)
        self._by_id[task.task_id] = task
        self._batches[task.batch_id] += 1
        if members.tasks[0] is task:
            self._push_head(group, members)

    def observed(self, kind: str, key: str) -> None:
        """The estimator has just learnt a duration for (kind, key): re-key what it can change."""
        if self.params.policy is DispatchPolicy.FIFO or self.estimator is None:
            return
        touched = self._of_key.get((kind, key), set()) | self._fallback.get(kind, set())
        for group in touched:
            members = self._groups[group]
            primary = self._primary(group)
            if primary != members.primary:
                members.primary = primary
                self._push_head(group, members)

    def pop(self) -> PendingVerification | None:
        """The next verification in the policy's (clock-independent) order, or None if empty."""
        while self._heap:
            _, _, _, group, version = heapq.heappop(self._heap)
            members = self._groups.get(group)
            if members is None or members.version != version:
                continue  # stale: the group was re-keyed, emptied or got a new head
            task = members.tasks.pop(0)
            if members.tasks:
                self._push_head(group, members)
            else:
                self._drop(group)
            self._forget(task)
            return task
        return None

    def discard(self, task_id: TaskId) -> PendingVerification | None:
        """Take a verification out of the queue (dispatched by `decide`, or cancelled)."""
        task = self._by_id.get(task_id)
        if task is None:
            return None
        group = self._group_of(task)
        members = self._groups[group]
        was_head = members.tasks[0] is task
        members.tasks.remove(task)
        if not members.tasks:
            self._drop(group)
        elif was_head:
            self._push_head(group, members)
        self._forget(task)
        return task

    def _drop(self, group: _Group) -> None:
        del self._groups[group]
        self._fallback.get(group[0], set()).discard(group)
        same_key = self._of_key[group[:2]]
        same_key.discard(group)
        if not same_key:
            del self._of_key[group[:2]]

    def _forget(self, task: PendingVerification) -> None:
        del self._by_id[task.task_id]
        self._batches[task.batch_id] -= 1
        if not self._batches[task.batch_id]:
            del self._batches[task.batch_id]

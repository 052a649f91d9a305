"""The pending verifications kept in the order `decide` dispatches them, updated as things change.

`decide(snapshot, now, params)` is the definition: it sorts every pending verification on every call,
which is right for a handful of workers and wrong for a queue of ten thousand behind 256 workers
(O(pending) per freed worker). Where a policy's order does not depend on the clock (`fifo`, `sjf`,
`lrpt`, and `distrs` while a single batch is queued, where latest-start order is longest planned
time first) this queue gives the same order incrementally: verifications that share a verifier
kind, key and elapsed time share an estimate, so they form one group in arrival order, and a heap
holds each group's head under the policy's key. When the estimator learns about a key, only the
groups whose estimate can have changed are re-keyed. Groups that have no history of their own share
the kind's estimate, so they wait in one bucket per (kind, elapsed) ordered by arrival, and the
bucket has one entry in the heap: learning about the kind re-keys one bucket, not every group in
it. With several batches queued under `distrs` the
order depends on the batches' predicted completions, which move with time: `needs_decide` says so
and the caller asks `decide` with the full snapshot (`tasks()`). Equivalence with `decide` is a
property test.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import BatchId, DispatchPolicy, PendingVerification, TaskId, VerifyParams

_Group = tuple[str, str, float]  # (kind, key, elapsed): verifications that share one estimate
_Bucket = tuple[str, float]  # (kind, elapsed): groups estimated from the kind (or the prior) alone
_Ref = tuple[int, str, str, float]  # in the heap: (0, kind, key, elapsed) a group, (1, kind, "", e) a bucket


@dataclass
class _Members:
    tasks: list[PendingVerification] = field(default_factory=list)  # sorted by (arrival, task id)
    primary: float = 0.0  # the group's key while it is in the heap itself (a bucket keeps its own)
    version: int = 0
    bucket: _Bucket | None = None  # set while the group's estimate is the kind's


@dataclass
class _BucketState:
    heads: list[tuple[float, str, _Group, int]] = field(default_factory=list)  # (arrival, id, group, v)
    primary: float = 0.0
    version: int = 0


class DispatchQueue:
    def __init__(self, params: VerifyParams, estimator: RemainingTime | None = None) -> None:
        self.params, self.estimator = params, estimator
        self._groups: dict[_Group, _Members] = {}
        self._heap: list[tuple[float, float, str, _Ref, int]] = []
        self._buckets: dict[_Bucket, _BucketState] = {}
        self._by_id: dict[TaskId, PendingVerification] = {}
        self.members: Mapping[TaskId, PendingVerification] = self._by_id  # read-only; `if q.members`: cheap
        self._batches: Counter[BatchId] = Counter()
        self._of_key: dict[tuple[str, str], set[_Group]] = {}  # (kind, key) -> its groups (elapsed differ)
        self._floored: dict[str, set[_Group]] = {}  # per kind: groups lifted by a running sibling
        self._gangs = 0  # queued verifications that need more than one worker
        self._versions = itertools.count(1)  # one counter: a group or bucket made anew never reuses one

    def __len__(self) -> int:
        return len(self._by_id)

    def tasks(self) -> tuple[PendingVerification, ...]:
        """Every pending verification, oldest first (for a snapshot)."""
        return tuple(self._by_id.values())

    @property
    def gangs(self) -> int:
        """Queued verifications that need more than one worker at once."""
        return self._gangs

    @property
    def needs_decide(self) -> bool:
        """True when the order depends on the clock (`distrs` with more than one batch queued) or a
        gang verification is queued (it needs k free workers at once: `decide` holds workers for it)."""
        return bool(self._gangs) or (self.params.policy is DispatchPolicy.DISTRS and len(self._batches) > 1)

    def _group_of(self, task: PendingVerification) -> _Group:
        if self.params.policy is DispatchPolicy.FIFO:
            return ("", "", 0.0)  # one group: arrival order is the whole order
        return (task.kind, task.key, task.elapsed)

    def _primary(self, group: _Group) -> tuple[float, bool]:
        """The policy's key for a group, and whether it is the kind's (shared by its bucket)."""
        kind, key, elapsed = group
        est, policy = self.estimator, self.params.policy
        if policy is DispatchPolicy.FIFO or est is None:
            return 0.0, False
        source = est.estimate(kind, key, elapsed).source
        shared = source in ("kind", "prior")
        if source.endswith("+running"):  # the kind's estimate, lifted: moves with the kind's history
            self._floored.setdefault(kind, set()).add(group)
        else:
            self._floored.get(kind, set()).discard(group)
        match policy:
            case DispatchPolicy.SJF:
                return est.remaining(kind, key, elapsed), shared
            case DispatchPolicy.LRPT:
                return -est.remaining(kind, key, elapsed), shared
            case _:  # distrs, one batch: the longest planned time has the earliest latest start
                return -est.quantile(kind, key, self.params.quantile, elapsed), shared

    def _place(self, group: _Group, members: _Members) -> None:
        """(Re)compute a group's key and put its head where it belongs: the heap or its bucket."""
        old = members.bucket
        members.primary, shared = self._primary(group)
        members.bucket = (group[0], group[2]) if shared else None
        if members.bucket is not None:  # every member of a bucket has the kind's estimate
            self._buckets.setdefault(members.bucket, _BucketState()).primary = members.primary
        self._push_head(group, members)
        if old is not None and old != members.bucket and old in self._buckets:
            self._refresh(old)  # its heap entry may have been this group's head

    def _push_head(self, group: _Group, members: _Members) -> None:
        members.version = next(self._versions)
        head = members.tasks[0]
        if members.bucket is None:
            ref = (0, *group)
            heapq.heappush(self._heap, (members.primary, head.arrival, head.task_id, ref, members.version))
            return
        bucket = self._buckets.setdefault(members.bucket, _BucketState(primary=members.primary))
        heapq.heappush(bucket.heads, (head.arrival, head.task_id, group, members.version))
        self._refresh(members.bucket)

    def _refresh(self, name: _Bucket) -> None:
        """Drop a bucket's stale heads and give the heap one entry for its best group."""
        bucket = self._buckets[name]
        while bucket.heads:
            _, _, group, version = bucket.heads[0]
            members = self._groups.get(group)
            if members is not None and members.version == version and members.bucket == name:
                break
            heapq.heappop(bucket.heads)
        if not bucket.heads:
            del self._buckets[name]
            return
        bucket.version = next(self._versions)
        arrival, task_id, _, _ = bucket.heads[0]
        ref = (1, name[0], "", name[1])
        heapq.heappush(self._heap, (bucket.primary, arrival, task_id, ref, bucket.version))

    def push(self, task: PendingVerification) -> None:
        if task.task_id in self._by_id:
            raise ValueError(f"verification {task.task_id} is already queued")
        group = self._group_of(task)
        members = self._groups.get(group)
        new = members is None
        if members is None:
            members = self._groups[group] = _Members()
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
        self._gangs += task.slots > 1
        if new:
            self._place(group, members)
        elif members.tasks[0] is task:
            self._push_head(group, members)

    def observed(self, kind: str, key: str) -> None:
        """The estimator has just learnt about (kind, key): re-key that key's groups, and the kind's
        buckets (their shared estimate moved with the kind's history)."""
        if self.params.policy is DispatchPolicy.FIFO or self.estimator is None:
            return
        for group in self._of_key.get((kind, key), set()) | self._floored.get(kind, set()):
            if group in self._groups:
                self._place(group, self._groups[group])
        for name in [b for b in self._buckets if b[0] == kind]:
            bucket = self._buckets.get(name)
            if bucket is None or not bucket.heads:
                continue
            group = bucket.heads[0][2]
            primary, shared = self._primary(group)
            if shared and primary != bucket.primary:
                bucket.primary = primary  # the bucket's key is the one its members go by
                self._refresh(name)

    def pop(self) -> PendingVerification | None:
        """The next verification in the policy's (clock-independent) order, or None if empty."""
        while self._heap:
            _, _, _, ref, version = heapq.heappop(self._heap)
            if ref[0] == 1:  # a bucket: its best group
                name = (ref[1], ref[3])
                bucket = self._buckets.get(name)
                if bucket is None or bucket.version != version:
                    continue
                _, _, group, head_version = bucket.heads[0]
                members = self._groups.get(group)
                if members is None or members.version != head_version or members.bucket != name:
                    self._refresh(name)  # its best head went stale: re-enter with the current one
                    continue
                heapq.heappop(bucket.heads)
            else:
                group = (ref[1], ref[2], ref[3])
                members = self._groups.get(group)
                if members is None or members.version != version or members.bucket is not None:
                    continue  # stale: the group was re-keyed, emptied, moved or got a new head
            members = self._groups[group]
            task = members.tasks.pop(0)
            if members.tasks:
                self._push_head(group, members)
            else:
                bucket_name = members.bucket
                self._drop(group)
                if bucket_name is not None and bucket_name in self._buckets:
                    self._refresh(bucket_name)
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
            bucket_name = members.bucket
            self._drop(group)
            if bucket_name is not None and bucket_name in self._buckets:
                self._refresh(bucket_name)
        elif was_head:
            self._push_head(group, members)
        self._forget(task)
        return task

    def _drop(self, group: _Group) -> None:
        del self._groups[group]
        self._floored.get(group[0], set()).discard(group)
        same_key = self._of_key[group[:2]]
        same_key.discard(group)
        if not same_key:
            del self._of_key[group[:2]]

    def _forget(self, task: PendingVerification) -> None:
        del self._by_id[task.task_id]
        self._gangs -= task.slots > 1
        self._batches[task.batch_id] -= 1
        if not self._batches[task.batch_id]:
            del self._batches[task.batch_id]

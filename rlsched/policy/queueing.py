"""First-come-first-served queues on W identical workers: waits, completion, and a batch's bound.

SPEC section 5: the same work waits differently by arrival pattern. Ten 1 s jobs all at t=0 on one
worker wait 0..9 s (mean 4.5 s); 80 one-second calls on 48 workers: 48 start, 32 wait 1 s (mean
0.4 s), all done at 2 s; on 96 workers, done at 1 s. SPEC section 3: a batch of verifications
cannot finish before `max_i(a_i + c_i + g_i)`; arrivals 0, 6, 12 needing 10, 2, 8 s end at 20 s on one
worker or two, and if the last needs 80 s the batch ends at 92 s however many workers there are.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueResult:
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    waits: tuple[float, ...]
    mean_wait: float
    completion: float
    formula: str = "FCFS on W workers: start_i = max(a_i, earliest free worker); wait_i = start_i - a_i"


@dataclass(frozen=True)
class BatchResult:
    queue: QueueResult
    completion: float
    lower_bound: float  # max_i(a_i + c_i + g_i): no number of workers finishes sooner
    formula: str = "batch completion = max_i end_i >= max_i(a_i + c_i + g_i)"


def _check(arrivals: Sequence[float], services: Sequence[float], workers: int) -> None:
    if len(arrivals) != len(services):
        raise ValueError(f"{len(arrivals)} arrivals but {len(services)} service times; give one per job")
    if not arrivals:
        raise ValueError("no jobs given")
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if any(a < 0 for a in arrivals) or any(s < 0 for s in services):
        raise ValueError("arrival and service times must be non-negative")


def fcfs(arrivals: Sequence[float], services: Sequence[float], workers: int) -> QueueResult:
    """Jobs in arrival order (ties by index), each to the worker that frees up first."""
    _check(arrivals, services, workers)
    order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i))
    free_at = [0.0] * workers  # a heap of the times workers become free
    starts = [0.0] * len(arrivals)
    ends = [0.0] * len(arrivals)
    for i in order:
        earliest = heapq.heappop(free_at)
        starts[i] = max(arrivals[i], earliest)
        ends[i] = starts[i] + services[i]
        heapq.heappush(free_at, ends[i])
    waits = tuple(s - a for s, a in zip(starts, arrivals, strict=True))
    return QueueResult(tuple(starts), tuple(ends), waits, sum(waits) / len(waits), max(ends))


def batch(
    arrivals: Sequence[float], cpu: Sequence[float], gpu: Sequence[float] | None, workers: int
) -> BatchResult:
    """A batch of verifications, each a CPU stage then a GPU stage on one worker, FCFS."""
    gpu = gpu if gpu is not None else [0.0] * len(cpu)
    if len(gpu) != len(cpu):
        raise ValueError(f"{len(cpu)} CPU times but {len(gpu)} GPU times; give one per sample")
    services = [c + g for c, g in zip(cpu, gpu, strict=True)]
    q = fcfs(arrivals, services, workers)
    bound = max(a + s for a, s in zip(arrivals, services, strict=True))
    return BatchResult(q, q.completion, bound)


def arrival_aware_bound(arrivals: Sequence[float], services: Sequence[float], workers: int) -> float:
    """No non-preemptive schedule on `workers` workers finishes a batch sooner than the largest of:
    the slowest sample from its arrival, `max_i(a_i + s_i)`; the work that arrives from any time `t`
    on, spread perfectly over every worker, `t + sum_{a_i >= t} s_i / W`; and, among the samples
    arriving from `t` on, the `kW + 1` longest (some worker must run `k + 1` of them one after
    another), `t + (k + 1) x the shortest of those` (the last is evaluated at every 16th arrival
    time from the end, and at the first: any subset of times gives a valid bound)."""
    _check(arrivals, services, workers)
    pairs = sorted(zip(arrivals, services, strict=True))
    bound = max(a + s for a, s in pairs)
    suffix = 0.0
    later: list[float] = []  # the services of the samples seen so far (arriving from `a` on), ascending
    for n, (a, s) in enumerate(reversed(pairs)):
        suffix += s
        bound = max(bound, a + suffix / workers)
        bisect.insort(later, s)
        if n % 16 == 15 or n == len(pairs) - 1:
            bound = max(bound, a + _stacked(later, workers))
    return bound


def _stacked(ascending: list[float], workers: int) -> float:
    """Among the `kW + 1` longest, some worker runs `k + 1` in a row: `(k + 1) x` the shortest of them."""
    best, k = 0.0, 1
    while k * workers + 1 <= len(ascending):
        best = max(best, (k + 1) * ascending[-(k * workers + 1)])
        k += 1
    return best

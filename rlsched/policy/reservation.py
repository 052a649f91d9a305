"""Reservations with backfill: a job past its maximum wait holds only what it needs, from when it
will have it, and every other job starts around that (EASY backfill, as Slurm's backfill scheduler).

Every job has an expected run time, its walltime: declared with the job (`--walltime`, Slurm's
`--time`), else its priority class's default. A running job is expected to end at its start plus
its walltime. A job past its maximum wait that fits its quota but not the nodes, and that no
preemption can make room for, gets a reservation: the earliest time the running jobs' expected ends
(and the evictions under way) free enough for all its gangs, on the nodes that will free up. Later
jobs of the cycle start if they leave the reservation whole: they are expected to end before it
begins, or they take only what will still be spare when it begins. Nothing else is held back: a
queue whose jobs never touch the reserved nodes is not slowed at all.

Overruns: a job still running at its expected end is given `overrun_grace_s` more, then another,
and so on; its expected end is its walltime plus a whole number of grace periods. So a reservation
that counted on it keeps its start for one grace period, then moves one grace period later each time
the job runs past it; the jobs admitted meanwhile were admitted against the start that held then.

Several jobs may be past their bound at once; each later reservation is made on what the earlier ones
leave (their needs held from now until they are expected to end), so none can delay another.

Pure: the clock is the `now` passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rlsched.policy.cluster_model import AdmissionParams, RunningJob
from rlsched.policy.placement import Placement, Resources, add, minus

Parts = tuple[tuple[str, Resources], ...]  # (node, resources)


def walltime(priority: str, declared: float | None, params: AdmissionParams) -> float:
    """A job's expected run time: its own, else its class's default."""
    return declared if declared is not None else params.classes[priority].walltime_s


def expected_end(started: float, walltime_s: float, now: float, grace_s: float) -> float:
    """When a running job is expected to end: its start plus its walltime, and past that (an
    overrun), plus as many grace periods as it has run into (the reservation moves a grace period
    at a time)."""
    end = started + walltime_s
    if now < end or grace_s <= 0:
        return max(end, now)
    return end + grace_s * (math.floor((now - end) / grace_s) + 1)  # still running at its end: it overran


@dataclass(frozen=True)
class Release:
    """What a job holds and when it is expected to give it back."""

    at: float
    job: str
    parts: Parts


def releases_of(running: Sequence[RunningJob], now: float, params: AdmissionParams) -> list[Release]:
    out = []
    for r in running:
        wall = walltime(r.priority, r.walltime_s, params)
        end = expected_end(r.started, wall, now, params.overrun_grace_s)
        out.append(Release(end, r.name, (*r.allocations, *r.elastic)))
    return out


@dataclass
class Reservation:
    """A starving job's hold: from `start` to `end`, `need` on each node; `spare` is what will still
    be free at `start` besides it on each of those nodes (what a job that runs past `start` may take
    there)."""

    job: str
    start: float
    end: float
    need: dict[str, dict[str, float]]
    spare: dict[str, dict[str, float]]
    waits_for: tuple[str, ...]  # the jobs whose expected ends make room for it


Place = Callable[[Mapping[str, Resources]], tuple[list[Placement], dict[str, Resources]] | str]


def reserve(
    job: str,
    wall_s: float,
    bundles: Sequence[Sequence[Resources]],
    place: Place,
    coming: Mapping[str, Resources],
    releases: Sequence[Release],
    held: Sequence[Reservation],
    now: float,
) -> Reservation | None:
    """The earliest reservation for a job whose gangs' bundles are `bundles` (`place` puts them on a
    free map): on what is free once the evictions under way end (`coming`), plus each release in
    the order expected, less what the reservations already `held` need until they end. None if not
    even every release would do."""
    base = {n: dict(r) for n, r in coming.items()}
    steps: list[tuple[float, str, Parts]] = [(r.at, r.job, r.parts) for r in releases]
    for h in held:
        for node, held_there in h.need.items():
            if node in base:
                base[node] = minus(base[node], held_there)
        steps.append((h.end, h.job, tuple(h.need.items())))
    steps.sort(key=lambda s: (s[0], s[1]))
    times = sorted({max(at, now) for at, _, _ in steps})

    def free_at(t: float | None) -> dict[str, dict[str, float]]:
        out = {n: dict(r) for n, r in base.items()}
        for at, _, parts in steps:
            if t is not None and max(at, now) > t:
                break
            for node, res in parts:
                if node in out:
                    out[node] = add(out[node], res)
        return out

    # the free capacity only grows with time, so the earliest time it fits is found by bisection,
    # from the first time the cluster as a whole has enough of every resource
    candidates: list[float] = [now, *[t for t in times if t > now]]
    lo, hi = _enough_from(candidates, bundles, base, steps, now), len(candidates) - 1
    if isinstance(place(free_at(candidates[hi])), str):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if isinstance(place(free_at(candidates[mid])), str):
            lo = mid + 1
        else:
            hi = mid
    start = candidates[lo]
    avail = free_at(start)
    placed = place(avail)
    assert not isinstance(placed, str)
    need: dict[str, dict[str, float]] = {}
    for gang, pl in zip(bundles, placed[0], strict=True):
        for bundle, node in zip(gang, pl.nodes, strict=True):
            need[node] = add(need.get(node, {}), bundle)
    spare = {n: minus(avail[n], need[n]) for n in need}  # elsewhere it needs nothing: no bound there
    waits_for = tuple(sorted({j for at, j, _ in steps if max(at, now) == start and start > now}))
    return Reservation(job, start, start + wall_s, need, spare, waits_for)


def _enough_from(
    times: Sequence[float],
    bundles: Sequence[Sequence[Resources]],
    base: Mapping[str, Resources],
    steps: Sequence[tuple[float, str, Parts]],
    now: float,
) -> int:
    """The first of `times` by which the cluster, taken whole, has as much of every resource as the
    job asks (no placement can succeed earlier)."""
    want = add(*(b for gang in bundles for b in gang))
    have = add(*base.values())
    k = 0
    for i, t in enumerate(times):
        while k < len(steps) and max(steps[k][0], now) <= t:
            have = add(have, *(res for _, res in steps[k][2]))
            k += 1
        if all(have.get(r, 0.0) >= v - 1e-9 for r, v in want.items()):
            return i
    return len(times) - 1


def bound_by(reservations: Sequence[Reservation], end: float) -> tuple[int, ...]:
    """The reservations a job expected to end at `end` must leave whole: those that begin before."""
    return tuple(i for i, r in enumerate(reservations) if end > r.start)


def room(
    free: Mapping[str, Resources], reservations: Sequence[Reservation], bound: Sequence[int]
) -> Mapping[str, Resources]:
    """What such a job may take on each node: what is free now, and no more than what each of those
    reservations leaves spare at its start (`free` itself when it is bound by none)."""
    if not bound:
        return free
    out = dict(free)
    for i in bound:
        for node, spare in reservations[i].spare.items():
            if node in out:
                cap = dict(out[node])
                for k, v in spare.items():
                    if k in cap and v < cap[k]:
                        cap[k] = v
                out[node] = cap
    return out


def take(reservations: Sequence[Reservation], bound: Sequence[int], used: Parts) -> None:
    """A job admitted past these reservations' starts holds `used` then: it is no longer spare."""
    for i in bound:
        spare = reservations[i].spare
        for node, res in used:
            if node in spare:
                spare[node] = minus(spare[node], res)

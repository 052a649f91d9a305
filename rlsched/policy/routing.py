"""Where one endpoint request runs, and which instances a reload leaves behind: the rules that keep an
agent's episode on one policy while the fleet's weights move on.

Candidates are READY instances at an admissible version (`rlsched.policy.versions`), the same rule
the job's own requests follow. A turn of an episode already begun carries the version its first turn
was sampled at (`pin`): it runs on a candidate holding that version if there is one, else on the
freshest candidate, and the episode is then mixed (`Routed.mixed`, with the reason). Among equals
the least loaded instance takes it (fewest requests in flight for its rows), then the newest
version, then the first name. No candidate at all is a value (`NoInstance`): the endpoint answers
503 with Retry-After.

`hold_back` is the other half of pinning: a reload to a new version leaves, for each version that
open episodes began on and that stays admissible, one instance at that version (the one serving
most of them), so that their later turns still find it. Under `max_staleness` 0 nothing is held:
no instance may lag, and those episodes become mixed. At least one instance always takes the new
version.

`Refill` is when an instance's rows take more of a job's requests: SLOT refills rows as their
requests arrive (once `refill_min` are free: each refill is a call to the instance, which costs a
CPU-bound toy model more than a freed row does), so an instance stays nearly full while requests
wait; BATCH waits for every request of its last route, as a static batch does (a long sample then
holds its instance's other rows idle), and keeps a batch's make-up independent of timing, so that a
seed's curve reproduces exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from rlsched.policy.versions import admissible


class Refill(StrEnum):
    """When an instance's freed rows take more of a job's requests (`rollout.refill`)."""

    SLOT = "slot"  # each row as soon as its request arrives: an instance holds `request_batch` at once
    BATCH = "batch"  # `request_batch` more only once every request of its last route has arrived


@dataclass(frozen=True, slots=True)
class InstanceView:
    """What routing knows of one instance."""

    name: str
    ready: bool
    version: int
    in_flight: int = 0  # requests of the endpoint running or queued on it
    rows: int = 1  # sequences it generates at once


@dataclass(frozen=True, slots=True)
class Routed:
    name: str
    version: int
    mixed: str | None = None  # why a pinned request runs at another version; None: it does not


@dataclass(frozen=True, slots=True)
class NoInstance:
    reason: str


def candidates(views: Sequence[InstanceView], latest: int, max_staleness: int) -> list[InstanceView]:
    """READY instances at an admissible version."""
    return [v for v in views if v.ready and admissible(v.version, latest, max_staleness)]


def _least_loaded(views: Sequence[InstanceView]) -> InstanceView:
    return min(views, key=lambda v: (v.in_flight / max(v.rows, 1), -v.version, v.name))


def route(
    views: Sequence[InstanceView], latest: int, max_staleness: int, pin: int | None = None
) -> Routed | NoInstance:
    """The instance that takes the next request (of an episode begun at version `pin`, if given)."""
    able = candidates(views, latest, max_staleness)
    if not able:
        ready = sorted({v.version for v in views if v.ready})
        held = f"READY instances hold versions {ready}" if ready else "no instance is READY"
        return NoInstance(
            f"no instance can serve: {held}, and version {latest} allows down to {latest - max_staleness}"
        )
    if pin is None:
        best = _least_loaded(able)
        return Routed(best.name, best.version)
    pinned = [v for v in able if v.version == pin]
    if pinned:
        best = _least_loaded(pinned)
        return Routed(best.name, best.version)
    newest = max(v.version for v in able)
    best = _least_loaded([v for v in able if v.version == newest])
    why = (
        f"version {pin} is no longer admissible (latest {latest}, max_staleness {max_staleness})"
        if not admissible(pin, latest, max_staleness)
        else f"no READY instance holds version {pin}"
    )
    return Routed(best.name, best.version, why)


def hold_back(
    views: Sequence[InstanceView],
    open_episodes: Mapping[int, Mapping[str, int]],
    new_version: int,
    max_staleness: int,
) -> set[str]:
    """The instances a reload to `new_version` leaves where they are. `open_episodes`: for each
    version that open episodes began on, how many of them each instance has served."""
    held: set[str] = set()
    room = sum(v.ready for v in views) - 1  # at least one instance takes the new version
    for version, served in sorted(open_episodes.items(), reverse=True):  # the newest pins first
        if len(held) >= room or not admissible(version, new_version, max_staleness):
            continue
        holders = [v for v in views if v.ready and v.version == version and v.name not in held]
        if holders:
            held.add(max(holders, key=lambda v: (served.get(v.name, 0), -v.in_flight, v.name)).name)
    return held

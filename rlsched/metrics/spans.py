"""One span schema for the runtime and the simulator, and the per-iteration figures derived from it.

A span is a kind, an id, a start and an end on one clock (the runtime's monotonic clock or the
simulator's virtual one), the iteration it belongs to, and free-form attributes (which worker, how
many tokens, which weight version). From an iteration's spans come its phase times, how much
verification overlapped generation, and the critical path: generation, then the verification tail
that generation did not hide, then update, publish and load. From a batch's spans come its
verification figures against the lower bound no schedule beats (`verification_batch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlsched.policy.queueing import arrival_aware_bound


class SpanKind(StrEnum):
    ITERATION = "iteration"
    GENERATE = "generate"  # one sample, from request to its arrival back at the controller
    VERIFY = "verify"  # one verification attempt, from dispatch to outcome
    UPDATE = "update"
    PUBLISH = "publish"
    TRANSFER = "transfer"  # one instance pulling a version over the weight link
    LOAD = "load"  # one instance's engine taking a version
    CONFIRM = "confirm"  # the loaded version's checksum against the published one
    JOIN = "join"  # a new instance from ALLOCATED to READY (its transfer, load and confirm inside)
    PREEMPT = "preempt"  # an instance reclaimed: from the decision to its requests re-queued
    RESUME = "resume"  # a reclaimed request, re-queued to continue from its saved tokens
    EVAL = "eval"
    BATCH = "batch"  # one instance's generate call: from its requests routed to its stream's end


@dataclass(slots=True)
class Span:
    """One timed piece of work. A value, never changed once made: not frozen only because a frozen
    dataclass costs five times as much to build, and the simulator builds two per sample."""

    kind: SpanKind
    id: str
    start: float
    end: float
    iteration: int
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "id": self.id,
            "start": self.start,
            "end": self.end,
            "iteration": self.iteration,
            "attrs": dict(self.attrs),
        }


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per phase of one iteration, and how the phases fitted together."""

    t_generate: float  # first generation start to last generation end
    t_verify: float  # first verification start to last verification end
    t_verify_exposed: float  # verification still running after the last sample was generated
    t_update: float
    t_publish: float
    t_load: float
    t_iter: float
    overlap_fraction: float  # share of verification busy time spent while generation still ran
    critical_path: tuple[tuple[str, float], ...]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: round(v, 4) for k, v in self.__dict__.items() if isinstance(v, float)}
        out["critical_path"] = [[name, round(sec, 4)] for name, sec in self.critical_path]
        return out


def set_aside(spans: list[Span], after: int) -> list[Span]:
    """The spans of iterations after `after`, which run again, leave `spans` (in place) and come back
    marked `redone`: they leave the phase times, and the timeline keeps them."""
    gone = [s for s in spans if s.iteration > after]
    spans[:] = [s for s in spans if s.iteration <= after]
    return [Span(s.kind, s.id, s.start, s.end, s.iteration, {**s.attrs, "redone": True}) for s in gone]


def _window(spans: Sequence[Span]) -> tuple[float, float] | None:
    if not spans:
        return None
    return min(s.start for s in spans), max(s.end for s in spans)


def _length(window: tuple[float, float] | None) -> float:
    return 0.0 if window is None else window[1] - window[0]


def _busy_inside(spans: Iterable[Span], lo: float, hi: float) -> float:
    return sum(max(0.0, min(s.end, hi) - max(s.start, lo)) for s in spans)


def phase_times(spans: Sequence[Span]) -> PhaseTimes:
    """Phase times of one iteration's spans (all spans passed belong to the same iteration)."""
    by_kind: dict[SpanKind, list[Span]] = {k: [] for k in SpanKind}
    for s in spans:
        by_kind[s.kind].append(s)
    gen, ver = _window(by_kind[SpanKind.GENERATE]), _window(by_kind[SpanKind.VERIFY])
    busy = sum(s.duration for s in by_kind[SpanKind.VERIFY])
    hidden = _busy_inside(by_kind[SpanKind.VERIFY], *gen) if gen else 0.0
    exposed = max(0.0, ver[1] - gen[1]) if gen and ver else _length(ver)
    iteration = _window(by_kind[SpanKind.ITERATION]) or _window(spans)
    t_update = _length(_window(by_kind[SpanKind.UPDATE]))
    t_publish = _length(_window(by_kind[SpanKind.PUBLISH]))
    # between updates every instance takes the new version: transfer, load, confirm; a joiner's
    # spans (attrs join=True) overlap generation and are not a phase of their own
    reload = [
        s
        for k in (SpanKind.TRANSFER, SpanKind.LOAD, SpanKind.CONFIRM)
        for s in by_kind[k]
        if not s.attrs.get("join")
    ]
    t_load = _length(_window(reload))
    path = (
        ("generate", _length(gen)),
        ("verify (exposed)", exposed),
        ("update", t_update),
        ("publish", t_publish),
        ("load", t_load),
    )
    return PhaseTimes(
        t_generate=_length(gen),
        t_verify=_length(ver),
        t_verify_exposed=exposed,
        t_update=t_update,
        t_publish=t_publish,
        t_load=t_load,
        t_iter=_length(iteration),
        overlap_fraction=hidden / busy if busy > 0 else 0.0,
        critical_path=tuple((name, sec) for name, sec in path if sec > 0),
    )


@dataclass(frozen=True)
class BatchFigures:
    """How one batch's verification went against what no schedule on `workers` workers could beat."""

    completion: float  # the last verification's end, from the batch's first generation start
    bound: float  # arrival_aware_bound over the measured arrivals and verification times
    exposed: float  # verification still running after the last sample arrived
    busy: float  # verification seconds


def verification_batch(spans: Sequence[Span], workers: int) -> BatchFigures:
    """The figures of one batch (all `spans` belong to it: its generations and verifications)."""
    gen = [s for s in spans if s.kind is SpanKind.GENERATE]
    ver = {s.id: s for s in spans if s.kind is SpanKind.VERIFY}
    t0 = min(s.start for s in gen)
    arrivals = [s.end - t0 for s in gen]
    bound = arrival_aware_bound(arrivals, [ver[s.id].duration for s in gen], workers)
    done = max(v.end for v in ver.values()) - t0
    return BatchFigures(done, bound, done - max(arrivals), sum(v.duration for v in ver.values()))


def busy_fraction(spans: Iterable[Span], lo: float, hi: float) -> float:
    """The share of [lo, hi] covered by at least one of `spans` (their union, clipped)."""
    if hi <= lo:
        return 0.0
    covered, reach = 0.0, lo
    for start, end in sorted((max(s.start, lo), min(s.end, hi)) for s in spans):
        if end <= reach:
            continue
        covered += end - max(start, reach)
        reach = end
    return covered / (hi - lo)


def chrome_trace(spans: Iterable[Span]) -> dict[str, Any]:
    """Spans as Chrome trace events ("X" complete events, microseconds): opens in Perfetto."""
    spans = list(spans)
    t0 = min((s.start for s in spans), default=0.0)
    lanes: dict[str, int] = {}
    events = []
    for s in spans:
        lane = str(s.attrs.get("lane", s.kind))
        tid = lanes.setdefault(lane, len(lanes) + 1)
        events.append(
            {
                "name": f"{s.kind} {s.id}",
                "cat": str(s.kind),
                "ph": "X",
                "pid": 1,
                "tid": tid,
                "ts": round((s.start - t0) * 1e6, 1),
                "dur": round(s.duration * 1e6, 1),
                "args": {"iteration": s.iteration, **dict(s.attrs)},
            }
        )
    meta = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": lane}}
        for lane, tid in lanes.items()
    ]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

"""The rollout fleet's decisions on the timeline: the spans the Ray driver records for a pull (its
transfer, load and confirm, and for a join the whole join), a preemption, and a resumed request.

A pull's spans carry the instance's own clock (`time.monotonic` on its node: on one machine the
controller's; across nodes, read their durations rather than their positions). Only the reload
phase's pulls are a phase of the iteration: the others say `join: true`, and `phase_times` leaves
them out.
"""

from __future__ import annotations

from rlsched.core.fleet_io import Joined, Left, PullWhy, Resumption
from rlsched.metrics.spans import Span, SpanKind
from rlsched.rollout.instance import JoinReport
from rlsched.store.resumes import Stitched


def pull_spans(e: Joined, r: JoinReport) -> list[Span]:
    attrs = {"lane": e.name, "version": r.version, "join": e.why is not PullWhy.RELOAD, "why": str(e.why)}
    detail = {"bytes": r.nbytes, "gbps": round(r.gbps, 4), "streams": r.streams, "corrupt": r.corrupt}
    it, sid = e.iteration, f"{e.name}-v{r.version}"
    spans = [
        Span(SpanKind.TRANSFER, sid, *r.transfer, it, attrs | detail),
        Span(SpanKind.LOAD, sid, *r.load, it, attrs),
        Span(SpanKind.CONFIRM, sid, *r.confirm, it, attrs),
    ]
    if e.why is PullWhy.JOIN:
        spans.append(Span(SpanKind.JOIN, e.name, e.started, r.confirm[1], it, attrs))
    return spans


def preempt_span(e: Left, end: float, iteration: int) -> Span:
    attrs = {"lane": e.name, "why": e.why, "requeued": e.requeued}
    return Span(SpanKind.PREEMPT, e.name, e.started, end, iteration, attrs)


def resume_span(info: Resumption, done: Stitched, end: float, iteration: int) -> Span:
    """Where a resumed request's tokens came from, how many were saved and kept, and how far the
    recomputed log-probabilities drift from the saved ones."""
    attrs = {
        "lane": "controller",
        "from": info.source,
        "saved": info.saved,
        "resumed_from": done.resumed_from,
        "choice": str(info.choice),
        "final_tokens": done.sample.num_tokens,
        "logprob_drift": done.logprob_drift,
    }
    return Span(SpanKind.RESUME, done.sample.request_id, info.preempted_at, end, iteration, attrs)


def route_span(name: str, started: float, requests: int, end: float, iteration: int) -> Span:
    """A route's call on an instance (its requests or episodes), as a span of the instance's lane (its
    busy time)."""
    return Span(SpanKind.BATCH, name, started, end, iteration, {"lane": name, "requests": requests})

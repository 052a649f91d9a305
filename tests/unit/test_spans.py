"""Phase times from spans: overlap, the exposed verification tail, the critical path, the trace."""

from __future__ import annotations

import pytest

from rlsched.metrics.spans import Span, SpanKind, busy_fraction, chrome_trace, phase_times

G, V, U, P = SpanKind.GENERATE, SpanKind.VERIFY, SpanKind.UPDATE, SpanKind.PUBLISH


def span(kind: SpanKind, start: float, end: float, i: str = "x") -> Span:
    return Span(kind, i, start, end, iteration=0)


def test_sequential_iteration_sums_its_phases() -> None:
    # SPEC section 1: 40 + 10 + 30 + 5 = 85 s when phases run one after another
    spans = [span(G, 0, 40), span(V, 40, 50), span(U, 50, 80), span(P, 80, 85)]
    t = phase_times(spans)
    assert (t.t_generate, t.t_verify, t.t_verify_exposed, t.t_update, t.t_publish) == (40, 10, 10, 30, 5)
    assert t.t_iter == 85 and t.overlap_fraction == 0.0
    assert t.critical_path == (("generate", 40), ("verify (exposed)", 10), ("update", 30), ("publish", 5))


def test_overlapped_verification_hides_all_but_the_tail() -> None:
    # SPEC section 3 exercise: arrivals 0, 6, 12 needing 10, 2, 8 s on one worker: ends 10, 12, 20
    gens = [span(G, 0, 0, "a"), span(G, 0, 6, "b"), span(G, 0, 12, "c")]
    vers = [span(V, 0, 10, "a"), span(V, 10, 12, "b"), span(V, 12, 20, "c")]
    t = phase_times(gens + vers)
    assert t.t_generate == 12 and t.t_verify == 20
    assert t.t_verify_exposed == 8
    assert t.overlap_fraction == pytest.approx(12 / 20)


def test_chrome_trace_events() -> None:
    trace = chrome_trace([Span(G, "s1", 10.0, 10.5, 3, {"lane": "rollout-0"}), span(V, 10.2, 10.4)])
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert events[0]["ts"] == 0.0 and events[0]["dur"] == 500000.0
    assert events[0]["args"]["iteration"] == 3
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {"rollout-0", "verify"}


def test_busy_fraction_is_the_union_of_the_spans_clipped_to_the_window() -> None:
    spans = [Span(SpanKind.BATCH, "a", s, e, 1) for s, e in ((0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (9.0, 12.0))]
    assert busy_fraction(spans, 1.0, 10.0) == pytest.approx((2.0 + 1.0 + 1.0) / 9.0)
    assert busy_fraction([], 0.0, 1.0) == 0.0 and busy_fraction(spans, 2.0, 2.0) == 0.0

"""A pipelined job's held work survives its JSON form whole: every sample's tokens, behaviour log-probs
and per-token versions, every verdict and fault, the problems in flight and the counters."""

from __future__ import annotations

from rlsched.engine.protocol import FinishReason, RequestId, Sample, WeightVersion
from rlsched.rl.pending import JudgedGroup, PendingWork
from verifiers.protocol import ExecutionFault, FaultKind, Verdict


def _sample(rid: str, spans: tuple[tuple[int, int], ...] = ()) -> Sample:
    return Sample(
        RequestId(rid), (1, 2, 3), (7, 8, 9, 10), (-0.5, -1.25, -0.125, -2.0), "12", FinishReason.STOP,
        WeightVersion(4), stop_reason=10, resumed_tokens=1, version_spans=spans,
    )  # fmt: skip


def test_held_work_round_trips_through_json() -> None:
    swapped = _sample("5-0-0", ((3, 0), (4, 2)))
    outcomes = (Verdict("5-0-0@1", 1.0, True, "ok"), ExecutionFault("5-0-1@1", FaultKind.TIMEOUT, "slow", 1))
    work = PendingWork(
        groups=(JudgedGroup(5, (swapped, _sample("5-0-1")), outcomes),),
        problems=(17, 18),
        dropped_groups=2,
        buffer_peak=9,
    )
    back = PendingWork.of_json(work.to_json())
    assert back == work
    assert back.groups[0].samples[0].oldest_version == 3
    assert back.groups[0].samples[0].token_versions() == [(3, 0, 2), (4, 2, 4)]
    assert back.groups[0].request_ids == ("5-0-0", "5-0-1")

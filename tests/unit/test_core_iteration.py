"""The iteration's core: when samples go to verification, when the batch is complete, the phases
after it in order, and what the dispatch policy reads of the batch."""

from __future__ import annotations

import pytest

from rlsched.core.iteration import (
    Committed,
    IterationCore,
    IterationParams,
    Judged,
    Offered,
    Publish,
    Reload,
    Reloaded,
    SampleArrived,
    Started,
    Update,
    Updated,
    Verify,
    VersionPublished,
)
from rlsched.policy.lifecycle import IllegalTransition, IterationPhase

IDS = ("1-0-0", "1-0-1", "1-1-0", "1-1-1")


def started(**params: object) -> IterationCore:
    core = IterationCore(IterationParams(**params))  # type: ignore[arg-type]
    assert core.handle(Started(10.0, 1, IDS)) == []
    return core


def test_overlap_verifies_each_sample_as_it_arrives_and_the_last_verdict_completes_the_batch() -> None:
    core = started()
    for n, rid in enumerate(IDS):
        assert core.handle(SampleArrived(11.0 + n, rid, 0)) == [Verify((rid,))]
    assert core.phase is IterationPhase.JUDGING and core.generation_s == pytest.approx(4.0)
    for rid in IDS[:-1]:
        assert core.handle(Judged(20.0, rid)) == []
    assert core.handle(Judged(21.0, IDS[-1])) == [Update(1, IDS, 0)]
    assert core.handle(Updated(22.0)) == [Publish(1)]
    assert core.handle(VersionPublished(23.0, 1)) == [Reload(1)]
    assert core.handle(Reloaded(24.0)) == [Committed(1, 0, 10.0, 4.0)]
    assert core.version == 1 and not core.waiting


def test_the_sequential_baseline_verifies_the_whole_batch_once_the_last_sample_is_in() -> None:
    core = started(overlap=False)
    for rid in IDS[:-1]:
        assert core.handle(SampleArrived(11.0, rid, 0)) == []
    assert core.handle(SampleArrived(12.0, IDS[-1], 0)) == [Verify(IDS)]


def test_verdicts_may_come_before_the_last_sample_but_the_batch_waits_for_it() -> None:
    core = started()
    for rid in IDS[:-1]:
        core.handle(SampleArrived(11.0, rid, 0))
        assert core.handle(Judged(11.5, rid)) == []
    assert core.handle(SampleArrived(12.0, IDS[-1], 0)) == [Verify((IDS[-1],))]
    assert core.handle(Judged(13.0, IDS[-1])) == [Update(1, IDS, 0)]


def test_unknown_repeated_or_late_samples_and_verdicts_are_counted_not_taken() -> None:
    core = started()
    core.handle(SampleArrived(11.0, IDS[0], 0))
    assert core.handle(SampleArrived(11.0, IDS[0], 0)) == []  # twice
    assert core.handle(SampleArrived(11.0, "2-0-0", 0)) == []  # not asked for
    assert core.handle(Judged(11.0, IDS[1])) == []  # not arrived
    core.handle(Judged(11.0, IDS[0]))
    assert core.handle(Judged(11.0, IDS[0])) == []  # twice
    assert core.unexpected == 4 and core.phase is IterationPhase.GENERATING


def test_offered_samples_join_the_batch_and_are_judged_like_the_rest() -> None:
    core = started()
    effects = core.handle(Offered(11.0, (("ep-1", 0), (IDS[0], 0))))
    assert effects == [Verify(("ep-1",)), Verify((IDS[0],))]
    assert core.requests == [*IDS, "ep-1"]
    for rid in IDS[1:]:
        core.handle(SampleArrived(12.0, rid, 0))
    for rid in (*IDS, "ep-1"):
        effects = core.handle(Judged(13.0, rid))
    assert effects == [Update(1, (*IDS, "ep-1"), 0)]


def test_the_update_keeps_versions_within_the_staleness_bound() -> None:
    core = IterationCore(IterationParams(max_staleness=1), version=5)
    core.handle(Started(0.0, 6, IDS[:1]))
    core.handle(SampleArrived(1.0, IDS[0], 5))
    assert core.handle(Judged(2.0, IDS[0])) == [Update(6, IDS[:1], 4)]


def test_the_batch_state_counts_what_is_still_generating_and_expects_the_last_generation_time() -> None:
    core = started(cost_rate=4.0, batch_prefix="job/iter-", kind="job")
    state = core.batch_state()
    assert (state.batch_id, state.cost_rate, state.outstanding, state.generation_end, state.kind) == (
        "job/iter-1", 4.0, 4, None, "job",
    )  # fmt: skip
    for rid in IDS:
        core.handle(SampleArrived(13.0, rid, 0))
        core.handle(Judged(13.0, rid))
    for event in (Updated(14.0), VersionPublished(15.0, 1), Reloaded(16.0)):
        core.handle(event)
    core.handle(Started(20.0, 2, ("2-0-0",)))
    assert (
        core.batch_state().generation_end == pytest.approx(20.0 + 3.0) and core.batch_state().outstanding == 1
    )


def test_phases_out_of_order_are_refused_by_the_table() -> None:
    core = started()
    with pytest.raises(IllegalTransition, match="from generating to publishing"):
        core.handle(Updated(11.0))
    with pytest.raises(ValueError, match="asks for no samples"):
        IterationCore(IterationParams()).handle(Started(0.0, 1, ()))

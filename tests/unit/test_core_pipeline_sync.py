"""Sync mode is the pipeline run zero versions ahead (`PipelineMode.SYNC`): one wave at a time, each
sample verified as it arrives (or the whole wave once its last sample is in, with `overlap` off), the
step taking the whole wave once every sample is judged, then publish, reload and commit, and only
then the next wave. The decisions the sequential core made before issue 42 merged it into the
pipeline (that core's tests, kept here against the one core), and the same rules checked on random
interleavings of arrivals and verdicts, with samples offered mid-generation, lagging instances inside
the staleness bound, and overlap on or off."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core import iteration as it
from rlsched.core.pipeline import PipelineCore, PipelineParams
from rlsched.policy.lifecycle import IllegalTransition
from rlsched.policy.versions import PipelineMode

IDS = ("1-0-0", "1-0-1", "1-1-0", "1-1-1")


def sync_pipeline(
    groups: int, group_size: int, k: int = 0, overlap: bool = True, version: int = 0, **params: object
) -> PipelineCore:
    p = PipelineParams(groups, group_size, k, groups, overlap, mode=PipelineMode.SYNC, **params)  # type: ignore[arg-type]
    return PipelineCore(p, version=version)


def started(**params: object) -> PipelineCore:
    core = sync_pipeline(2, 2, **params)  # type: ignore[arg-type]
    assert core.start() == [it.Generate(1)]
    assert core.handle(it.Started(10.0, 1, IDS)) == []
    return core


def test_overlap_verifies_each_sample_as_it_arrives_and_the_last_verdict_completes_the_batch() -> None:
    core = started()
    for n, rid in enumerate(IDS):
        assert core.handle(it.SampleArrived(11.0 + n, rid, 0)) == [it.Verify((rid,))]
    assert core.last_generation_s == pytest.approx(4.0)
    for rid in IDS[:-1]:
        assert core.handle(it.Judged(20.0, rid)) == []
    assert core.handle(it.Judged(21.0, IDS[-1])) == [it.Update(1, IDS, 0, ((0, 4),))]
    assert core.handle(it.Updated(22.0)) == [it.Publish(1)]
    assert core.handle(it.VersionPublished(23.0, 1)) == [it.Reload(1)]
    assert core.handle(it.Reloaded(24.0)) == [it.Committed(1, 0, 10.0, 4.0), it.Generate(2)]
    assert core.version == 1 and not core.waiting


def test_the_sequential_baseline_verifies_the_whole_batch_once_the_last_sample_is_in() -> None:
    core = started(overlap=False)
    for rid in IDS[:-1]:
        assert core.handle(it.SampleArrived(11.0, rid, 0)) == []
    assert core.handle(it.SampleArrived(12.0, IDS[-1], 0)) == [it.Verify(IDS)]


def test_verdicts_may_come_before_the_last_sample_but_the_batch_waits_for_it() -> None:
    core = started()
    for rid in IDS[:-1]:
        core.handle(it.SampleArrived(11.0, rid, 0))
        assert core.handle(it.Judged(11.5, rid)) == []
    assert core.handle(it.SampleArrived(12.0, IDS[-1], 0)) == [it.Verify((IDS[-1],))]
    assert core.handle(it.Judged(13.0, IDS[-1])) == [it.Update(1, IDS, 0, ((0, 4),))]


def test_unknown_repeated_or_late_samples_and_verdicts_are_counted_not_taken() -> None:
    core = started()
    core.handle(it.SampleArrived(11.0, IDS[0], 0))
    assert core.handle(it.SampleArrived(11.0, IDS[0], 0)) == []  # twice
    assert core.handle(it.SampleArrived(11.0, "2-0-0", 0)) == []  # not asked for
    assert core.handle(it.Judged(11.0, IDS[1])) == []  # not arrived
    core.handle(it.Judged(11.0, IDS[0]))
    assert core.handle(it.Judged(11.0, IDS[0])) == []  # twice
    assert core.unexpected == 4 and core.waiting


def test_offered_samples_join_the_batch_and_are_judged_like_the_rest() -> None:
    core = started()
    assert core.takes_offers
    assert core.handle(it.Offered(11.0, (("ep-1", 0), (IDS[0], 0)))) == [it.Verify(("ep-1",))]
    assert core.unexpected == 1  # one of the wave's own requests is not an offer
    effects: list[it.Effect] = []
    for rid in IDS:
        core.handle(it.SampleArrived(12.0, rid, 0))
    for rid in (*IDS, "ep-1"):
        effects = core.handle(it.Judged(13.0, rid))
    assert effects == [it.Update(1, (*IDS, "ep-1"), 0, ((0, 5),))]  # in the order they joined


def test_an_offer_after_the_last_sample_is_refused() -> None:
    core = sync_pipeline(1, 1)
    core.start()
    core.handle(it.Started(0.0, 1, ("a",)))
    core.handle(it.SampleArrived(1.0, "a", 0))
    assert not core.takes_offers
    assert core.handle(it.Offered(1.5, (("late", 0),))) == []
    assert core.unexpected == 1


def test_the_update_keeps_versions_within_the_staleness_bound() -> None:
    core = sync_pipeline(1, 1, k=1, version=5)
    core.start()
    core.handle(it.Started(0.0, 1, IDS[:1]))
    core.handle(it.SampleArrived(1.0, IDS[0], 4))  # an instance one version behind: admissible
    assert core.handle(it.Judged(2.0, IDS[0])) == [it.Update(1, IDS[:1], 4, ((1, 1),))]


def test_the_batch_state_counts_what_is_still_generating_and_expects_the_last_generation_time() -> None:
    core = started(cost_rate=4.0, batch_prefix="job/iter-", kind="job")
    (state,) = core.batch_states()
    assert (state.batch_id, state.cost_rate, state.outstanding, state.generation_end, state.kind) == (
        "job/iter-1", 4.0, 4, None, "job",
    )  # fmt: skip
    for rid in IDS:
        core.handle(it.SampleArrived(13.0, rid, 0))
        core.handle(it.Judged(13.0, rid))
    for event in (it.Updated(14.0), it.VersionPublished(15.0, 1), it.Reloaded(16.0)):
        core.handle(event)
    core.handle(it.Started(20.0, 2, ("2-0-0", "2-0-1", "2-1-0", "2-1-1")))
    core.handle(it.SampleArrived(21.0, "2-0-0", 1))
    (state,) = core.batch_states()
    assert state.generation_end == pytest.approx(20.0 + 3.0) and state.outstanding == 3


def test_phases_out_of_order_and_empty_waves_are_refused() -> None:
    core = started()
    with pytest.raises(IllegalTransition, match="from idle to publishing"):
        core.handle(it.Updated(11.0))
    fresh = sync_pipeline(1, 2)
    fresh.start()
    with pytest.raises(ValueError, match="asks for 0 samples"):
        fresh.handle(it.Started(0.0, 1, ()))


def test_sync_mode_accepts_any_staleness_bound_and_never_runs_ahead() -> None:
    for k in (0, 1, 3):
        core = sync_pipeline(2, 2, k)
        assert core.params.ahead == 0
        assert core.start() == [it.Generate(1)]
        assert core.handle(it.Started(0.0, 1, tuple("abcd"))) == []


def run_waves(seed: int, iterations: int, groups: int, size: int, k: int, overlap: bool, offers: int) -> None:
    """Waves of random interleavings, each checked against the sequential rules."""
    rng = random.Random(seed)
    base = rng.randint(0, 3)
    core = sync_pipeline(groups, size, k, overlap, base)
    assert core.start() == [it.Generate(1)]
    clock = 0.0
    for i in range(1, iterations + 1):
        clock += 1.0
        wave_start, version = clock, core.version
        requests = tuple(f"{i}-{n}" for n in range(groups * size))
        assert core.handle(it.Started(clock, i, requests)) == []  # nothing runs ahead
        pending = list(requests)
        rng.shuffle(pending)
        offered = [f"{i}-offer-{n}" for n in range(offers)]
        joined: list[str] = list(requests)  # the batch: the wave's requests, then offers as they join
        arrived: list[str] = []
        verified: list[str] = []
        last_arrival = clock
        effects: list[it.Effect] = []
        while pending or arrived:
            clock += 0.1
            if offered and pending and rng.random() < 0.2:
                rid = offered.pop()
                out = core.handle(it.Offered(clock, ((rid, version - rng.randint(0, k)),)))
                joined.append(rid)
                arrived.append(rid)
            elif pending and (not arrived or rng.random() < 0.6):
                rid = pending.pop()
                out = core.handle(it.SampleArrived(clock, rid, version - rng.randint(0, k)))
                arrived.append(rid)
                last_arrival = clock
            else:
                rid = arrived.pop(rng.randrange(len(arrived)))
                out = core.handle(it.Judged(clock, rid))
            verify = [r for e in out if isinstance(e, it.Verify) for r in e.request_ids]
            came = rid in arrived  # an arrival or an offer, not a verdict
            if overlap:  # each sample as it arrives
                assert verify == ([rid] if came else [])
            else:  # the whole wave at once, when its last own sample is in
                assert sorted(verify) == (sorted(joined) if came and not pending and rid in requests else [])
            verified += verify
            effects += out
        assert sorted(verified) == sorted(joined)  # every sample verified once
        (update,) = [e for e in effects if isinstance(e, it.Update)]
        assert update.iteration == i and update.request_ids == tuple(joined)  # in the order they went out
        assert update.oldest == version - k
        assert not [e for e in effects if isinstance(e, (it.Generate, it.Dropped))]
        clock += 1.0
        assert core.handle(it.Updated(clock)) == [it.Publish(version + 1)]
        clock += 0.1
        assert core.handle(it.VersionPublished(clock, version + 1)) == [it.Reload(version + 1)]
        clock += 0.5
        done = core.handle(it.Reloaded(clock))
        generation_s = pytest.approx(last_arrival - wave_start)
        assert done == [it.Committed(i, version, wave_start, generation_s), it.Generate(i + 1)]


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    iterations=st.integers(1, 4),
    groups=st.integers(1, 3),
    size=st.integers(1, 3),
    k=st.integers(0, 2),
    overlap=st.booleans(),
    offers=st.integers(0, 2),
)
def test_sync_mode_runs_one_whole_wave_at_a_time(
    seed: int, iterations: int, groups: int, size: int, k: int, overlap: bool, offers: int
) -> None:
    run_waves(seed, iterations, groups, size, k, overlap, offers)

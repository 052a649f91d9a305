"""Sync mode is the pipeline run zero versions ahead: fed the same events, `PipelineCore` in
`PipelineMode.SYNC` makes the sequential core's decisions (`IterationCore`) effect for effect, with
`Generate` where that core's drivers start the next iteration themselves. Checked on random
interleavings of arrivals and verdicts, with samples offered mid-generation, lagging instances inside
the staleness bound, and overlap on or off."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core import iteration as it
from rlsched.core.pipeline import PipelineCore, PipelineParams
from rlsched.policy.versions import PipelineMode


def sync_pipeline(groups: int, group_size: int, k: int, overlap: bool, version: int) -> PipelineCore:
    params = PipelineParams(groups, group_size, k, groups, overlap, mode=PipelineMode.SYNC)
    return PipelineCore(params, version=version)


def comparable(effects: list[it.Effect]) -> list[it.Effect]:
    """The effects both cores make: `Generate` is the pipeline's word to start, and the staleness
    histogram of an `Update` is the pipeline's own report."""
    return [
        replace(e, staleness=()) if isinstance(e, it.Update) else e
        for e in effects
        if not isinstance(e, it.Generate)
    ]


def run_both(seed: int, iterations: int, groups: int, size: int, k: int, overlap: bool, offers: int) -> None:
    rng = random.Random(seed)
    base = rng.randint(0, 3)
    old = it.IterationCore(it.IterationParams(overlap, 1.0, k), version=base)
    new = sync_pipeline(groups, size, k, overlap, base)
    assert new.start() == [it.Generate(1)]
    clock = 0.0

    def feed(event: it.Event) -> list[it.Effect]:
        a, b = old.handle(event), new.handle(event)
        assert comparable(b) == a, (event, a, b)
        return b

    for i in range(1, iterations + 1):
        clock += 1.0
        requests = tuple(f"{i}-{n}" for n in range(groups * size))
        after_start = feed(it.Started(clock, i, requests))
        assert not [e for e in after_start if isinstance(e, it.Generate)]  # nothing runs ahead
        version = old.version
        # arrivals in a random order, each verdict some time after its arrival; a few offered samples
        pending = list(requests)
        rng.shuffle(pending)
        offered = [f"{i}-offer-{n}" for n in range(offers)]
        arrived: list[str] = []
        effects: list[it.Effect] = []
        while pending or arrived:
            clock += 0.1
            if offered and pending and rng.random() < 0.2:
                rid = offered.pop()
                effects += feed(it.Offered(clock, ((rid, version - rng.randint(0, k)),)))
                arrived.append(rid)
            elif pending and (not arrived or rng.random() < 0.6):
                rid = pending.pop()
                effects += feed(it.SampleArrived(clock, rid, version - rng.randint(0, k)))
                arrived.append(rid)
            else:
                rid = arrived.pop(rng.randrange(len(arrived)))
                effects += feed(it.Judged(clock, rid))
        (update,) = [e for e in effects if isinstance(e, it.Update)]
        assert update.iteration == i
        clock += 1.0
        (publish,) = [e for e in feed(it.Updated(clock)) if isinstance(e, it.Publish)]
        clock += 0.1
        (reload,) = [e for e in feed(it.VersionPublished(clock, publish.version)) if isinstance(e, it.Reload)]
        clock += 0.5
        done = feed(it.Reloaded(clock))
        assert next(e for e in done if isinstance(e, it.Committed)).iteration == i
        # the next wave goes out exactly when the sequential core's driver would start it
        assert it.Generate(i + 1) in done
        assert reload.version == old.version


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
def test_sync_mode_makes_the_sequential_cores_decisions(
    seed: int, iterations: int, groups: int, size: int, k: int, overlap: bool, offers: int
) -> None:
    run_both(seed, iterations, groups, size, k, overlap, offers)


def test_an_offer_after_the_last_sample_is_refused_as_the_sequential_core_refuses_it() -> None:
    old = it.IterationCore(it.IterationParams(max_staleness=0))
    new = sync_pipeline(1, 1, 0, True, 0)
    new.start()
    for core in (old, new):
        core.handle(it.Started(0.0, 1, ("a",)))
        core.handle(it.SampleArrived(1.0, "a", 0))
        assert core.handle(it.Offered(1.5, (("late", 0),))) == []
        assert core.unexpected == 1


def test_sync_mode_accepts_any_staleness_bound_and_never_runs_ahead() -> None:
    for k in (0, 1, 3):
        core = sync_pipeline(2, 2, k, True, 0)
        assert core.params.ahead == 0
        assert core.start() == [it.Generate(1)]
        assert core.handle(it.Started(0.0, 1, tuple("abcd"))) == []

"""The RL job on a real local Ray cluster: gang placement, overlap seen in the spans, version discipline."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import ray
from ray.util import placement_group_table

from actors.controller import JobController
from actors.trainer import reserve_gang
from rlsched.config import JobConfig, load_config
from rlsched.errors import UserError
from rlsched.job.records import IterationRecord
from rlsched.metrics.spans import SpanKind

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

SMALL = ["grpo.prompts_per_step=8", "task.eval_size=64", "eval.curve_size=32"]


@pytest.fixture(scope="module")
def job(ray_session: None) -> Iterator[tuple[JobController, list[IterationRecord]]]:
    controller = JobController(load_config(None, SMALL), log=lambda _: None)
    controller.record()  # the iteration core's events and effects, for the replay below
    records = [controller.run_iteration(i) for i in (1, 2, 3)]
    yield controller, records
    controller.shutdown()


def _live_groups() -> set[str]:
    return {pid for pid, v in placement_group_table().items() if v["state"] != "REMOVED"}


def test_gang_that_does_not_fit_is_refused_with_what_is_missing() -> None:
    cfg = load_config(None, ["trainer.ranks=6", "trainer.cpus_per_rank=2", "trainer.placement_timeout_s=1"])
    before = _live_groups()
    with pytest.raises(UserError, match=r"CPU: needs 12, \d+ available") as info:
        reserve_gang(cfg.trainer)
    assert "could not be placed within 1 s" in str(info.value)
    assert _live_groups() == before  # nothing half-reserved is left behind


def test_gang_is_reserved_whole(job: tuple[JobController, list[IterationRecord]]) -> None:
    controller, _ = job
    table = placement_group_table(controller.group.pg)
    assert table["state"] == "CREATED" and table["strategy"] == "STRICT_PACK"
    assert len(table["bundles"]) == JobConfig().trainer.ranks


def test_verification_overlaps_generation(job: tuple[JobController, list[IterationRecord]]) -> None:
    controller, records = job
    for rec in records:
        spans = [s for s in controller.spans if s.iteration == rec.iteration]
        last_generation_end = max(s.end for s in spans if s.kind is SpanKind.GENERATE)
        first_verification_start = min(s.start for s in spans if s.kind is SpanKind.VERIFY)
        assert first_verification_start < last_generation_end


def test_every_sample_in_an_update_comes_from_the_allowed_version(
    job: tuple[JobController, list[IterationRecord]],
) -> None:
    controller, records = job
    for rec in records:
        assert rec.extra["sample_versions"] == [rec.version]  # staleness 0: exactly the current version
        assert rec.used == rec.samples == 8 * 8 and rec.stale_dropped == 0
        versions = {
            s.attrs["version"]
            for s in controller.spans
            if s.iteration == rec.iteration and s.kind is SpanKind.GENERATE
        }
        assert versions == {rec.version}
    assert [r.version for r in records] == [0, 1, 2]
    assert controller.version == 3
    assert all(ray.get(h.status.remote())[:2] == ("ready", 3) for h in controller.fleet.handles.values())


def test_trainer_ranks_hold_identical_weights(job: tuple[JobController, list[IterationRecord]]) -> None:
    controller, _ = job
    sums = controller.group.checksums()
    assert len(set(sums)) == 1


@pytest.mark.parametrize(("policy", "overlap", "refill"), [("sjf", False, "batch"), ("distrs", True, "slot")])
def test_estimate_driven_dispatch_learns_and_judges_every_sample(
    ray_session: None, policy: str, overlap: bool, refill: str
) -> None:
    """Each estimate-driven order judges every sample once and learns per problem; `sjf` runs as the
    sequential baseline (`schedule.overlap: false`), whose verification starts only once generation
    has ended (the module's job shows the overlap), with the instance refilled batch by batch, as
    before slot refills: its routes follow one another; refilled by slot, they overlap."""
    controller = JobController(
        load_config(
            None,  # small enough to fit beside the module's job (8 CPUs in all)
            [
                *SMALL,
                f"verifier.dispatch={policy}",
                f"schedule.overlap={str(overlap).lower()}",
                "verifier.workers=1",
                "trainer.ranks=1",
                "rollout.instances=1",
                f"rollout.refill={refill}",
            ],
        ),
        log=lambda _: None,
    )
    try:
        records = [controller.run_iteration(i) for i in (1, 2)]
    finally:
        controller.shutdown()
    samples = 8 * controller.cfg.grpo.group_size
    for it in (1, 2):
        verified = [s for s in controller.spans if s.kind is SpanKind.VERIFY and s.iteration == it]
        assert sorted(s.id for s in verified) == sorted({s.id for s in verified})  # each judged once
        assert len(verified) == samples
        if not overlap:
            generated = [s for s in controller.spans if s.kind is SpanKind.GENERATE and s.iteration == it]
            assert min(s.start for s in verified) >= max(s.end for s in generated)
    assert all(r.faults == 0 for r in records)
    batch = controller.cfg.rollout.request_batch
    for it in (1, 2):
        routes = sorted(
            (s.start, s.end) for s in controller.spans if s.kind is SpanKind.BATCH and s.iteration == it
        )
        apart = all(a[1] <= b[0] for a, b in itertools.pairwise(routes))
        if refill == "batch":  # whole batches, one after the other
            assert len(routes) == samples // batch and apart
        else:  # each freed row takes the next request at once, beside the rows still running
            assert len(routes) > samples // batch and not apart
    # the estimator learnt from the pool's outcomes: a key per problem once three siblings were judged
    kind = controller.cfg.verifier.kind
    learnt = [key for (k, key) in controller.estimator._by_key if k == kind]
    assert len(learnt) == 2 * 8 and controller.estimator.estimate(kind, learnt[0]).source == "key"


def test_the_iterations_recorded_run_replayed_in_virtual_time_makes_the_same_decisions(
    job: tuple[JobController, list[IterationRecord]],
) -> None:
    """Every event the Ray driver fed the iteration's core (each sample's arrival and verdict, the
    update, publish and reload), replayed through the simulator in the cores the simulator and
    `--local` build from the same config, gives the same effects."""
    from rlsched.core.iteration import Committed, Generate, Publish, Reload, Update, Verify
    from rlsched.sim.replay import replay
    from tests.helpers import replays_in_every_driver

    controller, _ = job
    trace = controller.run.trace
    assert trace is not None
    assert replays_in_every_driver(controller.cfg, trace) == []  # the sim's, --local's, a copy
    replayed = replay(trace)
    effects = [e for _, out in trace.steps for e in out]
    assert sum(isinstance(e, Verify) for e in effects) == 3 * 8 * controller.cfg.grpo.group_size
    phases = [Update, Publish, Reload, Committed, Generate]  # the next wave once the step before is in
    assert [type(e) for e in effects if not isinstance(e, Verify)] == phases * 3
    print(f"iteration trace: {replayed.events} events, {replayed.effects} effects, all equal on replay")

"""The pipelined (`async`) iteration's core: how far generation runs ahead, the buffer of judged
groups, whole groups dropped past the staleness bound, one reload at a time, commits in order; and
the simulator driving it through SPEC section 1's example."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core.iteration import (
    Committed,
    Dropped,
    Effect,
    Generate,
    Judged,
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
from rlsched.core.pipeline import PipelineCore, PipelineParams
from rlsched.metrics.spans import SpanKind
from rlsched.policy.lifecycle import IllegalTransition, TrainerPhase
from rlsched.sim.jobs import simulate
from rlsched.sim.scenario import ScenarioConfig


def ids(wave: int, n: int = 4) -> tuple[str, ...]:
    return tuple(f"{wave}-{i}" for i in range(n))


def params(**kw: object) -> PipelineParams:
    base: dict[str, object] = {"batch_groups": 2, "group_size": 2, "max_staleness": 1, "buffer_groups": 2}
    return PipelineParams(**(base | kw))  # type: ignore[arg-type]


def arrive_and_judge(core: PipelineCore, rids: tuple[str, ...], version: int, at: float) -> list[Effect]:
    out: list[Effect] = []
    for rid in rids:
        out += core.handle(SampleArrived(at, rid, version))
        out += core.handle(Judged(at + 0.1, rid))
    return out


def test_with_k_1_two_iterations_go_out_at_once_and_the_third_after_the_first_reload() -> None:
    core = PipelineCore(params())
    assert core.start() == [Generate(1)]
    assert core.handle(Started(0.0, 1, ids(1))) == [Generate(2)]
    assert core.handle(Started(0.0, 2, ids(2))) == []  # wave 3 would be 2 versions stale
    effects = arrive_and_judge(core, ids(1), 0, 1.0)
    assert [e for e in effects if not isinstance(e, Verify)] == [Update(1, ids(1), -1, ((0, 4),))]
    assert core.trainer is TrainerPhase.UPDATING
    assert core.handle(Updated(2.0)) == [Publish(1)]
    assert core.handle(VersionPublished(2.1, 1)) == [Reload(1)]
    assert core.handle(Reloaded(2.4)) == [Committed(1, 0, 0.0, 1.0), Generate(3)]


def test_the_trainer_steps_again_while_the_instances_reload_but_publishes_after_the_reload() -> None:
    core = PipelineCore(params())
    core.start()
    core.handle(Started(0.0, 1, ids(1)))
    core.handle(Started(0.0, 2, ids(2)))
    arrive_and_judge(core, ids(1), 0, 1.0)
    arrive_and_judge(core, ids(2), 0, 1.5)  # buffered: the trainer is busy
    assert len(core.buffer) == 2
    core.handle(Updated(2.0))
    assert core.handle(VersionPublished(2.1, 1)) == [Reload(1), Update(2, ids(2), 0, ((1, 4),))]
    assert core.handle(Updated(2.5)) == []  # version 1 still reloads: one reload at a time
    assert core.trainer is TrainerPhase.UPDATED
    assert core.handle(Reloaded(3.0)) == [Committed(1, 0, 0.0, 1.0), Publish(2), Generate(3)]
    with pytest.raises(IllegalTransition, match="trainer cannot go from publishing to publishing"):
        core.handle(Updated(3.1))


def test_a_group_past_the_bound_is_dropped_whole_and_said() -> None:
    core = PipelineCore(params(batch_groups=1, buffer_groups=3))
    core.start()
    core.handle(Started(0.0, 1, ids(1)))
    core.handle(Started(0.0, 2, ids(2)))
    core.trained = 3  # as if three steps had passed while these were generated
    effects = arrive_and_judge(core, ("1-0",), 2, 1.0) + arrive_and_judge(core, ("1-1",), 1, 1.0)
    assert Dropped(("1-0", "1-1"), 2) in effects  # 1-1 is 2 versions stale: its partner goes too
    assert core.dropped_groups == 1 and not any(isinstance(e, Update) for e in effects)
    effects = arrive_and_judge(core, ("1-2", "1-3"), 3, 2.0)
    assert Update(1, ("1-2", "1-3"), 2, ((0, 2),)) in effects


def test_a_batch_waits_for_an_older_group_that_would_go_stale_rather_than_take_a_newer_one() -> None:
    core = PipelineCore(params(batch_groups=1, buffer_groups=2))
    core.start()
    core.handle(Started(0.0, 1, ids(1)))
    core.handle(Started(0.0, 2, ids(2)))
    core.trained = 1  # as if a step had passed: wave 1 (sent out at version 0) is 1 stale now, 2 next
    effects = arrive_and_judge(core, ("2-0", "2-1"), 1, 1.0)  # wave 2's group is in first
    assert not any(isinstance(e, Update) for e in effects)  # wave 1's would be dropped after it
    effects = arrive_and_judge(core, ("1-0", "1-1"), 0, 1.2)
    assert [e for e in effects if isinstance(e, Update)] == [Update(1, ("1-0", "1-1"), 0, ((1, 2),))]
    assert [g.members for g in core.buffer] == [("2-0", "2-1")]


def test_generation_pauses_while_the_buffer_is_full() -> None:
    core = PipelineCore(params(max_staleness=4, batch_groups=2, buffer_groups=2))
    assert core.start() == [Generate(1)]
    core.handle(Started(0.0, 1, ids(1)))
    core.handle(Started(0.0, 2, ids(2)))
    assert core.handle(Started(0.0, 3, ids(3))) == [Generate(4)]
    arrive_and_judge(core, ids(1), 0, 1.0)  # the trainer takes these
    effects = arrive_and_judge(core, ids(2), 0, 1.5)  # these wait: the buffer is full
    assert len(core.buffer) == 2 and effects.count(Generate(4)) == 0
    assert core.handle(Started(2.0, 4, ids(4))) == []  # the one announced before goes out; no more


def test_a_resumed_pipeline_trains_its_restored_groups_first_and_drops_those_past_the_bound() -> None:
    """Resumed after step 4 at version 4: a group sampled at version 3 is 1 stale, trained first; one
    with a token of version 2 is 2 stale, dropped whole and counted after the run's earlier drops."""
    core = PipelineCore(params(batch_groups=1, buffer_groups=3), version=4, steps=4)
    old = [{"5-0": 3, "5-1": 3}, {"6-0": 3, "6-1": 2}]
    core.restore(old, at=10.0, dropped_groups=5, buffer_peak=3)
    effects = core.start()
    assert effects[0] == Dropped(("6-0", "6-1"), 3)
    assert Update(5, ("5-0", "5-1"), 3, ((1, 2),)) in effects
    assert effects.count(Generate(5)) == 1  # new waves go out behind them
    assert core.dropped_groups == 6 and core.buffer_peak == 3 and core.buffer == []


def test_restored_groups_that_fill_the_buffer_hold_new_waves_back_until_a_step_takes_them() -> None:
    core = PipelineCore(params(batch_groups=2, buffer_groups=2), version=2, steps=2)
    core.restore([{"3-0": 2, "3-1": 2}], at=0.0)
    assert core.start() == [Generate(3)]  # one group: no batch yet; room for new work
    core = PipelineCore(params(batch_groups=1, buffer_groups=1), version=2, steps=2)
    core.restore([{"3-0": 2, "3-1": 2}, {"4-0": 2, "4-1": 2}], at=0.0)
    assert core.start() == [Update(3, ("3-0", "3-1"), 1, ((0, 2),))]  # the other still fills the buffer


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_staleness": 0}, "mode async with max_staleness 0 cannot overlap anything"),
        ({"buffer_groups": 1}, r"buffer_groups 1 is smaller than one batch \(2 groups.*at least 2"),
    ],
)
def test_settings_that_cannot_run_are_refused_with_the_fix(kw: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        params(**kw)


def test_a_wave_of_part_groups_or_out_of_turn_is_refused() -> None:
    core = PipelineCore(params())
    core.start()
    with pytest.raises(ValueError, match="not whole groups of 2"):
        core.handle(Started(0.0, 1, ids(1, 3)))
    with pytest.raises(ValueError, match="the pipeline's next is 1"):
        core.handle(Started(0.0, 2, ids(2)))


# -- the invariants, under any order of events ---------------------------------------------------


@dataclass
class Driver:
    """Carries out the core's effects in an order hypothesis chooses, checking every invariant."""

    core: PipelineCore
    k: int
    size: int
    waves: list[tuple[str, ...]] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    unsent: list[str] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)
    trained: set[str] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)
    due: list[Effect] = field(default_factory=list)
    commits: list[int] = field(default_factory=list)
    published: int = 0
    reloading: bool = False
    now: float = 0.0

    def apply(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Generate):
                assert e.iteration == len(self.waves) + 1
                rids = tuple(f"{e.iteration}-{i}" for i in range(2 * self.size))
                self.waves.append(rids)
                self.unsent += rids
                self.apply(self.core.handle(Started(self.now, e.iteration, rids)))
            elif isinstance(e, Update):
                assert not set(e.request_ids) & (self.trained | self.dropped)
                assert all(self.versions[r] >= e.oldest for r in e.request_ids)  # never past the bound
                assert e.oldest == self.core.trained - self.k
                assert len(e.request_ids) % self.size == 0
                self.trained |= set(e.request_ids)
                self.due.append(e)
            elif isinstance(e, Dropped):
                assert any(self.versions[r] < e.oldest for r in e.request_ids)
                assert not set(e.request_ids) & self.trained
                self.dropped |= set(e.request_ids)
            elif isinstance(e, Publish):
                assert e.version == self.published + 1 and not self.reloading
                self.published = e.version
                self.due.append(e)
            elif isinstance(e, Reload):
                self.reloading = True
                self.due.append(e)
            elif isinstance(e, Committed):
                assert e.iteration == len(self.commits) + 1
                self.commits.append(e.iteration)

    def step(self, choice: int, lag: int) -> None:
        self.now += 0.1
        kinds = [k for k, todo in enumerate((self.unsent, self.unjudged, self.due)) if todo]
        if not kinds:
            return
        kind = kinds[choice % len(kinds)]
        if kind == 0:
            rid = self.unsent.pop(choice % len(self.unsent))
            self.versions[rid] = max(0, self.core.reloaded - lag)  # an instance a little behind
            self.unjudged.append(rid)
            self.apply(self.core.handle(SampleArrived(self.now, rid, self.versions[rid])))
        elif kind == 1:
            rid = self.unjudged.pop(choice % len(self.unjudged))
            self.apply(self.core.handle(Judged(self.now, rid)))
        else:
            e = self.due.pop(0)
            if isinstance(e, Update):
                self.apply(self.core.handle(Updated(self.now)))
            elif isinstance(e, Publish):
                self.apply(self.core.handle(VersionPublished(self.now, e.version)))
            elif isinstance(e, Reload):
                self.reloading = False
                self.apply(self.core.handle(Reloaded(self.now)))


@settings(max_examples=150, deadline=None)
@given(
    k=st.integers(1, 3),
    size=st.integers(1, 3),
    extra=st.integers(0, 2),
    moves=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3)), min_size=20, max_size=300),
)
def test_no_sample_is_trained_past_the_bound_twice_or_in_part_and_commits_come_in_order(
    k: int, size: int, extra: int, moves: list[tuple[int, int]]
) -> None:
    core = PipelineCore(PipelineParams(2, size, k, 2 + extra))
    driver = Driver(core, k, size)
    driver.apply(core.start())
    for choice, lag in moves:
        driver.step(choice, lag)
    for rid in driver.trained | driver.dropped:  # whole groups only
        wave, n = rid.split("-")
        group = {f"{wave}-{i}" for i in range(int(n) // size * size, int(n) // size * size + size)}
        assert group <= driver.trained or group <= driver.dropped
    assert core.committed == len(driver.commits) <= core.steps
    assert sum(core.stale_histogram.values()) == len(driver.trained)


# -- the simulator, through the same core --------------------------------------------------------


def spec_example(mode: str, k: int) -> ScenarioConfig:
    def const(v: float) -> dict[str, object]:
        return {"kind": "constant", "value": v}

    job = {
        "iterations": 24, "samples": 64, "group_size": 8, "instances": 4, "slots": 16,
        "tokens": const(100), "tokens_per_s": const(100), "verify_cpu_s": const(0.2),
        "update_s": const(0.8), "publish_s": const(0.1), "mode": mode, "max_staleness": k,
        "weights": {"bytes": 1e6, "egress_gbps": 1000, "receiver_gbps": 1000, "load_s": 0.3},
    }  # fmt: skip
    return ScenarioConfig.model_validate(
        {"cluster": {"gpus": 16, "cpus": 64}, "pool": {"cpu_workers": 64}, "jobs": [job]}
    )


@pytest.mark.parametrize(("mode", "k", "t_iter"), [("sync", 0, 2.4), ("async", 1, 1.3), ("async", 2, 1.3)])
def test_the_simulator_reproduces_the_spec_example_sequential_and_pipelined(
    mode: str, k: int, t_iter: float
) -> None:
    run = simulate(spec_example(mode, k), 0)
    ends = sorted(s.end for s in run.spans if s.kind is SpanKind.ITERATION)
    assert len(ends) == 24
    steady = statistics.median(b - a for a, b in pairwise(ends[8:]))
    assert steady == pytest.approx(t_iter, abs=1e-3)
    if mode == "async":
        assert run.dropped["job"] == 0 and max(run.staleness["job"]) <= k
        updates = [s for s in run.spans if s.kind is SpanKind.UPDATE]
        generating = [s for s in run.spans if s.kind is SpanKind.GENERATE]
        assert any(g.start < u.end and u.start < g.end for u in updates for g in generating)  # overlap


def test_a_scenario_refuses_async_without_staleness_or_with_too_small_a_buffer() -> None:
    with pytest.raises(ValueError, match="max_staleness 0 cannot overlap"):
        spec_example("async", 0)
    bad = spec_example("sync", 0).model_dump()
    bad["jobs"] = [bad["jobs"][0] | {"mode": "async", "max_staleness": 1, "buffer_groups": 4}]
    with pytest.raises(ValueError, match=r"smaller than one batch \(8 groups"):
        ScenarioConfig.model_validate(bad)

"""The simulator runs gang verifications and preemption through the same `decide` as the runtime."""

from __future__ import annotations

from typing import Any

from rlsched.metrics.spans import SpanKind
from rlsched.policy.verify import DispatchPolicy
from rlsched.sim.jobs import simulate
from rlsched.sim.scenario import ScenarioConfig


def job(name: str, trainer_gpus: int, generate_mean: float, verify_mean: float) -> dict[str, Any]:
    return {
        "name": name,
        "iterations": 2,
        "samples": 64,
        "group_size": 4,
        "problems": 16,
        "instances": 2,
        "slots": 8,
        "trainer_gpus": trainer_gpus,
        "generate_s": {"kind": "lognormal", "mean": generate_mean, "sigma": 0.5},
        "verify_cpu_s": {"kind": "lognormal", "mean": verify_mean, "sigma": 1.0},
    }


def scenario(**pool: Any) -> dict[str, Any]:
    """A 32-GPU and a 2-GPU job sharing four verifier workers."""
    return {
        "cluster": {"gpus": 64, "cpus": 8},
        "pool": {"cpu_workers": 4, **pool},
        "jobs": [job("big", 32, 4.0, 2.0), job("small", 2, 2.0, 4.0)],
    }


def test_gang_verifications_never_overcommit_the_pool() -> None:
    cfg = scenario()
    cfg["jobs"][1]["verify_slots"] = 3
    run = simulate(ScenarioConfig.model_validate(cfg), seed=1, policy=DispatchPolicy.DISTRS)
    slots = {"big": 1, "small": 3}
    events = []
    for s in run.spans:
        if s.kind is SpanKind.VERIFY:
            events += [(s.start, slots[s.attrs["job"]]), (s.end, -slots[s.attrs["job"]])]
    used = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at one instant
        used += delta
        peak = max(peak, used)
    assert peak <= 4
    verified = [s.id for s in run.spans if s.kind is SpanKind.VERIFY]
    assert len(verified) == len(set(verified)) == 2 * 2 * 64  # every sample judged exactly once


def test_a_gang_wider_than_the_pool_is_refused_by_name() -> None:
    cfg = scenario()
    cfg["jobs"][1]["verify_slots"] = 5
    try:
        ScenarioConfig.model_validate(cfg)
    except ValueError as err:
        assert "jobs.1.verify_slots is 5 but the pool has 4 CPU workers" in str(err)
    else:
        raise AssertionError("a gang wider than the pool was accepted")


def test_preemption_reruns_the_stopped_work_and_judges_every_sample_once() -> None:
    on = simulate(ScenarioConfig.model_validate(scenario(preempt=True)), seed=2, policy=DispatchPolicy.DISTRS)
    off = simulate(ScenarioConfig.model_validate(scenario()), seed=2, policy=DispatchPolicy.DISTRS)
    preempts = [d for d in on.decisions if " preempt " in f" {d}"]
    assert preempts and not [d for d in off.decisions if " preempt " in f" {d}"]
    assert all("for big/" in d for d in preempts)  # only the costlier group's work preempts
    for run in (on, off):  # a preempted run has a span of its own, as in the runtime
        verified = [s.id for s in run.spans if s.kind is SpanKind.VERIFY and s.attrs["outcome"] == "Verdict"]
        assert len(verified) == len(set(verified)) == 2 * 2 * 64
    stopped = [s for s in on.spans if s.kind is SpanKind.VERIFY and s.attrs["outcome"] == "Preempted"]
    # a run whose end fell at the very instant it was chosen finished first (its kill came after, at
    # the same time, as a kill can lose that race at runtime): judged, with no stopped span
    judged = [s for s in on.spans if s.kind is SpanKind.VERIFY and s.attrs["outcome"] == "Verdict"]
    ends = {(s.id, round(s.end, 9)) for s in judged}
    raced = [d for d in preempts if (d.split(" preempt ")[1].split(" on ")[0], float(d.split()[0])) in ends]
    assert len(stopped) == len(preempts) - len(raced) and len(raced) <= 1

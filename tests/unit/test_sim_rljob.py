"""The simulated RL jobs: deterministic, consistent with the analytic queue, the same policy calls,
two verification stages and several jobs on one pool."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import pytest

from rlsched.metrics.spans import SpanKind, phase_times
from rlsched.policy.queueing import batch
from rlsched.sim.jobs import simulate
from rlsched.sim.scenario import ScenarioConfig

JOB: dict[str, Any] = {
    "name": "a",
    "iterations": 2,
    "samples": 128,
    "instances": 2,
    "slots": 64,  # a batch as wide as an instance's share: every sample starts at once
    "generate_s": {"kind": "lognormal", "mean": 0.2, "sigma": 0.8},
    "verify_cpu_s": {"kind": "uniform", "low": 0.005, "high": 0.05},
}


def scenario(*jobs: dict[str, Any], cpu_workers: int = 3, gpu_workers: int = 0) -> ScenarioConfig:
    return ScenarioConfig.model_validate(
        {
            "cluster": {"gpus": 64, "cpus": 64},
            "pool": {"cpu_workers": cpu_workers, "gpu_workers": gpu_workers},
            "jobs": list(jobs) or [JOB],
        }
    )


def test_same_seed_same_decision_log_byte_for_byte() -> None:
    a, b = simulate(scenario(), seed=3), simulate(scenario(), seed=3)
    assert "\n".join(a.decisions).encode() == "\n".join(b.decisions).encode()
    assert sum(d.split(" ")[1] == "dispatch" for d in a.decisions) == 2 * 128
    assert simulate(scenario(), seed=4).decisions != a.decisions


def test_fifo_dispatch_matches_the_analytic_fcfs_batch() -> None:
    run = simulate(scenario(), seed=5)
    for it in (1, 2):
        gens = {s.id: s.end for s in run.spans if s.iteration == it and s.kind is SpanKind.GENERATE}
        vers = {s.id: s for s in run.spans if s.iteration == it and s.kind is SpanKind.VERIFY}
        ids = sorted(gens)
        model = batch([gens[i] for i in ids], [vers[i].duration for i in ids], None, 3)
        assert max(v.end for v in vers.values()) == pytest.approx(model.completion)


def test_overlap_beats_the_sequential_baseline_and_hides_verification() -> None:
    base = JOB | {"iterations": 3, "samples": 256, "slots": 64, "verify_cpu_s": 0.01}
    seq = simulate(scenario(base | {"overlap": False}), seed=1)
    ovl = simulate(scenario(base | {"overlap": True}), seed=1)
    for it in (1, 2, 3):
        s = phase_times([x for x in seq.spans if x.iteration == it])
        o = phase_times([x for x in ovl.spans if x.iteration == it])
        assert s.overlap_fraction == 0.0 and o.overlap_fraction > 0.9
        assert o.t_iter < s.t_iter


def test_gpu_stage_follows_the_cpu_stage_on_exclusive_devices() -> None:
    job = JOB | {"verify_gpu_s": {"kind": "uniform", "low": 0.01, "high": 0.03}}
    run = simulate(scenario(job, gpu_workers=2), seed=0)
    verify = [s for s in run.spans if s.kind is SpanKind.VERIFY]
    cpu = {s.id: s for s in verify if s.attrs["lane"].startswith("cpu-")}
    gpu = {s.id.removesuffix("/gpu"): s for s in verify if s.attrs["lane"].startswith("gpu-")}
    assert len(cpu) == len(gpu) == 2 * 128
    assert all(gpu[t].start >= cpu[t].end for t in cpu)
    by_device: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in gpu.values():
        by_device[s.attrs["lane"]].append((s.start, s.end))
    assert set(by_device) == {"gpu-0", "gpu-1"}
    for runs in by_device.values():  # one verification at a time on a device
        runs.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(runs))
    assert run.busy_s["gpu"] == pytest.approx(sum(s.duration for s in gpu.values()))


def test_two_jobs_share_one_pool_and_each_finishes_its_iterations() -> None:
    b = JOB | {"name": "b", "iterations": 3, "samples": 64}
    run = simulate(scenario(JOB, b, cpu_workers=4), seed=2)
    for name, its, samples in (("a", 2, 128), ("b", 3, 64)):
        spans = run.of_job(name)
        assert sorted({s.iteration for s in spans}) == list(range(1, its + 1))
        assert sum(s.kind is SpanKind.VERIFY for s in spans) == its * samples
    lanes = defaultdict(set)
    for s in run.spans:
        if s.kind is SpanKind.VERIFY:
            lanes[s.attrs["job"]].add(s.attrs["lane"])
    assert lanes["a"] & lanes["b"], "both jobs' samples ran on the same workers"
    assert all(f"{name} iteration" in "\n".join(run.decisions) for name in ("a", "b"))


def test_token_model_times_generation_and_the_update() -> None:
    job = JOB | {
        "generate_s": None,
        "tokens": 100,
        "tokens_per_s": 50,
        "update_s": 1.0,
        "update_tokens_per_s": 12800,
        "iterations": 1,
        "slots": 64,  # every sample of an instance at once
    }
    run = simulate(scenario(job), seed=0)
    gens = [s for s in run.spans if s.kind is SpanKind.GENERATE]
    assert all(s.duration == pytest.approx(2.0) for s in gens)  # 100 tokens at 50/s
    (update,) = [s for s in run.spans if s.kind is SpanKind.UPDATE]
    assert update.duration == pytest.approx(1.0 + 128 * 100 / 12800)


@pytest.mark.parametrize(
    "group_devices, max_worker_share, max_slowdown",
    # a costly idle group buys speed; a cheap one buys savings at some speed. Refilled slot by slot,
    # over seeds 0-4: 0.41-0.53 of the fixed pool's worker-seconds at the same iteration time, and
    # 0.24-0.33 for 1.00-1.23x the time (by batch, whose waves leave less idle pool to give back:
    # 0.64-0.77 and 0.25-0.32 for 1.00-1.10x)
    [(1000, 0.6, 1.0), (2, 0.4, 1.25)],
)
def test_pool_scaling_weighs_worker_seconds_against_the_idle_group(
    group_devices: int, max_worker_share: float, max_slowdown: float
) -> None:
    job = JOB | {"iterations": 2, "samples": 256, "slots": 32, "verify_cpu_s": 0.05, "problems": 32}
    job["group_size"] = 8
    job["trainer_gpus"] = group_devices
    base = {"cluster": {"gpus": 2000, "cpus": 64}, "jobs": [job], "policies": ["distrs"]}
    fixed = ScenarioConfig.model_validate(base | {"pool": {"cpu_workers": 32}})
    scaled = ScenarioConfig.model_validate(
        base | {"pool": {"cpu_workers": 32, "autoscale": True, "scale_interval_s": 0.2}}
    )
    a, b = simulate(fixed, seed=0), simulate(scaled, seed=0)
    for run in (a, b):
        assert sum(s.kind is SpanKind.VERIFY for s in run.spans) == 2 * 256
    assert b.worker_s["cpu"] < max_worker_share * a.worker_s["cpu"]
    assert b.t_iter(2) <= max_slowdown * a.t_iter(2) + 1e-9
    assert any(" pool -> " in d for d in b.decisions)


@pytest.mark.parametrize("policy", ["sjf", "lrpt", "distrs"])
def test_incremental_queue_and_decide_make_the_same_decisions(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator's queue (rlsched.policy.dispatch_queue) against `decide` on the whole queue,
    on a run with per-problem history, overdue siblings and the kind's fallback in play."""
    from rlsched.policy.dispatch_queue import DispatchQueue

    job = JOB | {
        "samples": 256,
        "group_size": 8,
        "problems": 32,
        "verify_cpu_s": {
            "kind": "mixture",
            "components": [{"weight": 9, "dist": 0.01}, {"weight": 1, "dist": 0.5}],
        },
    }
    cfg = ScenarioConfig.model_validate(
        {"cluster": {"gpus": 64, "cpus": 64}, "pool": {"cpu_workers": 4}, "jobs": [job], "policies": [policy]}
    )
    queued = simulate(cfg, seed=1).decisions
    monkeypatch.setattr(DispatchQueue, "needs_decide", property(lambda self: True))
    assert simulate(cfg, seed=1).decisions == queued


def test_the_simulator_stops_runs_at_the_runtimes_adaptive_timeout_and_retries_them() -> None:
    """The pool's core is the runtime's: a verification far past its problem's correct runs is
    killed at its timeout and retried (`verify_retries`), and every sample still ends judged once."""
    job = {**JOB, "samples": 64, "problems": 16, "group_size": 4, "verify_cpu_s": 0.5, "verify_spread": 1.5}
    cfg = scenario(job).model_dump()
    cfg["pool"].update(verify_retries=1, timeout={"floor_s": 0.5, "factor": 1.5, "cap_s": 5.0})
    run = simulate(ScenarioConfig.model_validate(cfg), seed=0)
    stops = [d for d in run.decisions if d.endswith(": timeout")]
    verify = [s for s in run.spans if s.kind is SpanKind.VERIFY]
    outcomes = [s.attrs["outcome"] for s in verify]
    assert stops and outcomes.count("ExecutionFault") == len(stops)
    assert all(s.duration <= 5.0 + 1e-9 for s in verify)  # nothing runs past the cap
    judged = {(s.id, s.iteration) for s in verify if s.attrs["outcome"] == "Verdict"}
    retried_out = [s for s in verify if s.attrs["outcome"] == "ExecutionFault" and s.attrs["attempt"] == 1]
    assert len(judged) + len(retried_out) == 2 * 64  # judged, or failed its retry too: each once

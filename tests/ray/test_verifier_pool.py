"""The Ray verifier pool against verifiers that hang, crash their worker, go silent or cannot judge.

Real actors, real kills: a slot is refilled only after the old worker's process has ended, and every
sample of the batch ends with a typed outcome.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest

from actors.pool import VerifierPool
from actors.waits import step
from rlsched.config_verifier import TimeoutConfig, VerifierConfig
from rlsched.metrics.spans import Span
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import BatchId, PendingVerification, TaskId
from verifiers.protocol import ExecutionFault, FaultKind, Verdict, VerifyRequest

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

HOSTILE = "tests.ray.hostile_verifiers"


def make_pool(retries: int = 1, **overrides: object) -> VerifierPool:
    cfg = VerifierConfig.model_validate(
        {
            "kind": "exact_answer",
            "workers": 2,
            "cpus_per_worker": 0.5,
            "timeout": TimeoutConfig(floor_s=0.5, cap_s=3.0, hard_cap_s=10.0, grace_s=1.0),
            **overrides,
        }
    )
    return VerifierPool(cfg, retries, RemainingTime(), [], log=lambda _: None)


def submit(pool: VerifierPool, n: int, text: str, reference: str, kind: str | None = None) -> TaskId:
    task = TaskId(f"s{n}")
    pool.submit(
        PendingVerification(task, BatchId("b"), time.monotonic(), kind=kind or "exact_answer", key=f"p{n}"),
        VerifyRequest(task, text, reference),
        kind,
        iteration=1,
    )
    return task


def gone(pid: int) -> bool:
    """No such process, or only its zombie (it has exited; its parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def assert_one_at_a_time(busy: dict[str, list[tuple[float, float]]]) -> None:
    """No worker's (start, end) intervals overlap."""
    for intervals in busy.values():
        intervals.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(intervals))


def test_a_hung_verification_is_killed_at_its_timeout_and_the_rest_proceed() -> None:
    pool = make_pool(retries=0)
    try:
        hung = submit(pool, 0, "x", "x", f"{HOSTILE}:hang")
        fine = [submit(pool, n, "42", "42") for n in range(1, 6)]
        start = time.monotonic()
        out = pool.drain(timeout_s=60)
        took = time.monotonic() - start
    finally:
        pool.shutdown()
    assert isinstance(out[hung], ExecutionFault) and out[hung].kind is FaultKind.TIMEOUT
    assert "timeout" in out[hung].detail
    assert all(isinstance(out[t], Verdict) and out[t].correct for t in fine)
    assert pool.counts.timeouts == 1 and pool.counts.replaced == 1
    assert took < 3.0 + 1.0 + 20  # the cap and the grace, plus a worker's restart on a busy machine


def test_a_hanging_solution_scores_zero_within_its_limit_and_grace_and_its_group_trains() -> None:
    """Issue 41, finding 6: the pool killed the worker at the sandbox's own deadline, so a hanging
    solution became a TIMEOUT fault, was retried and its group dropped: looping escaped a zero."""
    import json

    import torch

    from rlsched.rl.grpo import group_advantages

    pool = make_pool(retries=2, kind="code", timeout=TimeoutConfig(floor_s=0.5, cap_s=2.0, grace_s=3.0))
    tests = json.dumps({"tests": ["assert add(1, 2) == 3"]})
    try:
        start = time.monotonic()
        hang = submit(pool, 0, "def add(a, b):\n    while True:\n        pass\n", tests, "code")
        right = submit(pool, 1, "def add(a, b):\n    return a + b\n", tests, "code")
        out = pool.drain(timeout_s=60)
        took = time.monotonic() - start
    finally:
        pool.shutdown()
    assert isinstance(out[hang], Verdict) and out[hang].reward == 0.0, out[hang]
    assert "timeout" in out[hang].detail
    assert isinstance(out[right], Verdict) and out[right].correct
    assert pool.counts.timeouts == 0 and pool.counts.replaced == 0  # the sandbox stopped it, not a kill
    assert took < 2.0 + 3.0 + 15  # the limit and the grace, plus the workers' start on a busy machine
    advantages = group_advantages(torch.tensor([[out[hang].reward, out[right].reward]]))
    assert advantages[0, 0] < 0 < advantages[0, 1]  # the group trains: the hang is pushed down


def test_the_killed_workers_process_is_gone_before_its_slot_is_refilled() -> None:
    pool = make_pool(retries=0)
    try:
        pool.wait_started()
        before = {w: s.pid for w, s in pool.workers.items()}
        submit(pool, 0, "x", "x", f"{HOSTILE}:hang")
        pool.drain(timeout_s=60)
        pool.wait_started()
        after = {w: s.pid for w, s in pool.workers.items()}
    finally:
        pool.shutdown()
    killed = set(before) - set(after)
    assert len(killed) == 1 and len(after) == 2
    assert gone(before[killed.pop()])
    assert not set(before.values()) & (set(after.values()) - set(before.values()))


def test_a_worker_that_dies_mid_verification_has_its_sample_requeued() -> None:
    pool = make_pool(retries=1)
    try:
        tasks = [submit(pool, n, "7", "7", f"{HOSTILE}:crash_first") for n in range(3)]
        out = pool.drain(timeout_s=90)
    finally:
        pool.shutdown()
    assert all(isinstance(out[t], Verdict) and out[t].correct for t in tasks)  # judged on attempt 1
    assert pool.counts.died == 3 and pool.counts.replaced == 3
    attempts = sorted(s.attrs["attempt"] for s in pool.spans)
    assert attempts == [0, 0, 0, 1, 1, 1]


def test_a_silent_worker_is_declared_lost_and_its_work_is_requeued() -> None:
    pool = make_pool(retries=1, heartbeat_s=0.2, heartbeat_timeout_s=2.0)
    try:
        task = submit(pool, 0, "1.5", "x", f"{HOSTILE}:slow")
        pool.wait_started()
        pool.dispatch(())
        (run,) = pool.core.runs.values()
        pid = pool.workers[run.worker].pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # frozen, as a hung node would be: no answer to anything
        out = pool.drain(timeout_s=60)
    finally:
        pool.shutdown()
    assert isinstance(out[task], Verdict)  # the retry ran on a fresh worker
    assert pool.counts.lost == 1
    assert gone(pid)


def test_inputs_that_cannot_be_judged_are_typed_and_not_retried() -> None:
    pool = make_pool(retries=2)
    try:
        unknown = submit(pool, 0, "1", "1", "no_such_kind")
        unset = submit(pool, 1, "1", "")
        fine = submit(pool, 2, "1", "1")
        out = pool.drain(timeout_s=60)
    finally:
        pool.shutdown()
    for task, words in ((unknown, "no_such_kind"), (unset, "no reference")):
        fault = out[task]
        assert isinstance(fault, ExecutionFault) and fault.kind is FaultKind.INPUT and words in fault.detail
    assert isinstance(out[fine], Verdict) and out[fine].correct
    assert [s.attrs["attempt"] for s in pool.spans] == [0, 0, 0]  # bad input is not retried


def test_a_gang_verification_holds_all_its_workers_and_no_worker_runs_two_things() -> None:
    pool = make_pool(retries=0, workers=3)
    try:
        for n in range(6):
            task = TaskId(f"s{n}")
            pool.submit(
                PendingVerification(
                    task, BatchId("b"), time.monotonic(), key=f"p{n}", slots=2 if n % 2 else 1
                ),
                VerifyRequest(task, "0.3", "x"),
                f"{HOSTILE}:slow",
                iteration=1,
            )
        pool.wait_started()
        out = pool.drain(timeout_s=60)
    finally:
        pool.shutdown()
    assert all(isinstance(o, Verdict) for o in out.values()) and len(out) == 6
    busy: dict[str, list[tuple[float, float]]] = {}
    for s in pool.spans:
        assert len(s.attrs["gang"]) == (1 if int(s.id[1:]) % 2 else 0)
        for worker in (s.attrs["lane"], *s.attrs["gang"]):
            busy.setdefault(worker, []).append((s.start, s.end))
    assert_one_at_a_time(busy)


def test_urgent_work_preempts_a_cheaper_batch_and_the_stopped_run_is_rerun() -> None:
    from rlsched.policy.verify import BatchState

    pool = make_pool(retries=0, workers=1, dispatch="distrs", preempt=True)
    for _ in range(3):  # history: the cheap batch's problem takes 20 s, the urgent one 1 s
        pool.estimator.observe("exact_answer", "cheap", 20.0)
        pool.estimator.observe("exact_answer", "urgent", 1.0)
    now = time.monotonic()
    batches = (
        BatchState(BatchId("big"), cost_rate=64.0),
        BatchState(BatchId("small"), cost_rate=1.0, outstanding=1, generation_end=now + 100.0),
    )
    try:
        pool.wait_started()
        cheap = TaskId("cheap")
        pool.submit(
            PendingVerification(cheap, BatchId("small"), now, kind="exact_answer", key="cheap"),
            VerifyRequest(cheap, "2.5", "x"),  # under the 3 s cap, rerun included
            f"{HOSTILE}:slow",
            iteration=1,
        )
        pool.dispatch(batches)
        time.sleep(1.0)
        urgent = TaskId("urgent")
        pool.submit(
            PendingVerification(urgent, BatchId("big"), time.monotonic(), kind="exact_answer", key="urgent"),
            VerifyRequest(urgent, "0.2", "x"),
            f"{HOSTILE}:slow",
            iteration=1,
        )
        out = pool.drain(batches, timeout_s=60)
    finally:
        pool.shutdown()
    assert isinstance(out[cheap], Verdict) and isinstance(out[urgent], Verdict)
    assert pool.counts.preempted == 1
    runs = [(s.id, s.attrs["attempt"], s.attrs["outcome"], s.start) for s in pool.spans]
    assert [r[:3] for r in runs] == [
        ("cheap", 0, "Preempted"),
        ("urgent", 0, "Verdict"),
        ("cheap", 1, "Verdict"),
    ]


def test_two_stage_verifiers_compile_on_cpu_workers_and_run_on_exclusive_gpu_workers() -> None:
    import json
    import shutil

    from rlsched.errors import UserError
    from verifiers.protocol import Prepared

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc (the CUDA toolkit) is not installed")
    kernel = "__global__ void one(int *x) { *x = 1; }\nint main() { return 0; }\n"
    reference = json.dumps({"expected_stdout": "", "timeout_s": 10})
    cfg = VerifierConfig(kind="cuda", workers=2, cpus_per_worker=0.5, gpu_workers=2)
    spans: list[Span] = []
    gpu = VerifierPool(cfg, 0, RemainingTime(), spans, log=lambda _: None, stage="gpu")

    def to_gpu(
        task: PendingVerification, request: VerifyRequest, kind: str | None, it: int, p: Prepared
    ) -> None:
        gpu.submit(task, request, kind, it, p.payload)

    cpu = VerifierPool(cfg, 0, RemainingTime(), spans, log=lambda _: None, stage="cpu", on_prepared=to_gpu)
    try:
        for n, text in enumerate([kernel, kernel, kernel, "__global__ void broken( {"]):
            task = TaskId(f"c{n}")
            cpu.submit(
                PendingVerification(task, BatchId("b"), time.monotonic(), "cuda", f"k{n}"),
                VerifyRequest(task, text, reference),
                None,
                1,
            )
        while not (cpu.idle and gpu.idle):
            for pool in (cpu, gpu):
                pool.dispatch(())
            step([cpu, gpu], timeout_s=0.2)
        out = {**cpu.take_outcomes(), **gpu.take_outcomes()}
        with pytest.raises(UserError, match="gpu_workers is 3 but the Ray cluster has 2 GPU"):
            VerifierPool(cfg.model_copy(update={"gpu_workers": 3}), 0, RemainingTime(), [], stage="gpu")
    finally:
        cpu.shutdown()
        gpu.shutdown()
    broken = out[TaskId("c3")]
    assert isinstance(broken, Verdict) and not broken.correct  # ends at the CPU stage: does not compile
    for n in range(3):  # compiled on a CPU worker, then the GPU worker found no device: typed, not zero
        fault = out[TaskId(f"c{n}")]
        assert isinstance(fault, ExecutionFault) and fault.kind is FaultKind.RESOURCES
        assert "no CUDA device" in fault.detail
    gpu_spans = [s for s in spans if s.id.endswith("/gpu")]
    assert len(gpu_spans) == 3 and all(s.attrs["lane"].startswith("gpu-verifier-") for s in gpu_spans)
    cpu_spans = [s for s in spans if not s.id.endswith("/gpu")]
    assert all(s.attrs["lane"].startswith("verifier-") for s in cpu_spans)
    assert sorted(s.attrs["outcome"] for s in cpu_spans) == ["Prepared"] * 3 + ["Verdict"]
    by_gpu: dict[str, list[tuple[float, float]]] = {}
    for s in gpu_spans:
        by_gpu.setdefault(s.attrs["lane"], []).append((s.start, s.end))
    assert_one_at_a_time(by_gpu)  # one verification per GPU at a time


def test_a_recorded_ray_run_replayed_in_virtual_time_makes_the_same_decisions() -> None:
    """Equivalence by construction, checked: every event the Ray driver fed the pool's core (each at
    its controller-clock time) replayed through the simulator gives the same effects, one for one."""
    from rlsched.sim.replay import compare, replay

    pool = make_pool(retries=1, workers=2, dispatch="sjf", heartbeat_s=0.2, heartbeat_timeout_s=5.0)
    trace = pool.record()
    try:
        hung = submit(pool, 0, "x", "x", f"{HOSTILE}:hang")  # times out twice: retried once
        for n in range(1, 7):
            submit(pool, n, "0.2" if n % 2 else "42", "42", f"{HOSTILE}:slow" if n % 2 else None)
        out = pool.drain(timeout_s=60)
    finally:
        pool.shutdown()
    assert isinstance(out[hung], ExecutionFault) and out[hung].kind is FaultKind.TIMEOUT
    assert pool.counts.timeouts == 2 and len(out) == 7
    replayed = replay(trace)
    assert compare(trace, replayed) == []
    assert replayed.events == len(trace.steps) and replayed.effects > 0
    kinds = {type(e).__name__ for _, effects in trace.steps for e in effects}
    assert {"StartRun", "StopWorker", "StartWorker", "AskHeartbeat", "Settled"} <= kinds
    print(f"pool trace: {replayed.events} events, {replayed.effects} effects, all equal on replay")

"""Supervised jobs come back by themselves (`rlsched run --requeue`, what `rlsched submit` runs), on a
real Ray cluster under the cluster scheduler:

- the job's driver killed with SIGKILL mid-iteration: the supervisor reports it, the scheduler
  requeues the job behind its backoff, and the next attempt resumes from the newest checkpoint;
- the job preempted by a high-priority job: it checkpoints and stops, waits in the queue while the
  other runs, and resumes when admitted again; it then finishes with every iteration committed
  once, each with all of its requests (no sample lost or used twice);
- then the scheduler's actor killed mid-iteration (the chaos suite's scheduler fault): Ray restarts
  it with its state, and the job under it finishes whole, not requeued again (one job for all
  three: each job start on this cluster is about 50 s of CI);
- a job whose driver keeps dying is parked after the admin file's `requeue.limit`, with the reason,
  and its supervisor exits with status 1.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from rlsched.chaos import GROUP, PROMPTS, SETS, STEPS, TITLES, Fault, check_run, command, committed, processes
from tests.helpers import ONE_NODE_ADMIN, ONE_OF_EACH, ROOT, rlsched, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ADMIN = (
    ONE_NODE_ADMIN.replace(
        "priority_classes:\n", "priority_classes:\n  high: {value: 100, preemptible: false}\n"
    )
    + "requeue: {backoff_base_s: 1, backoff_max_s: 2, limit: 1}\n"
)


def _attempt(supervisor: subprocess.Popen[bytes], previous: int | None = None) -> int:
    """The pid of the supervisor's running attempt (a new one, when `previous` is given)."""

    def child() -> int | None:
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(supervisor.pid)], capture_output=True, text=True
        )
        pids = [int(p) for p in out.stdout.split()]
        return next((p for p in pids if p != previous), None)

    return int(wait_for(child, "the supervisor's attempt", 120))


def _supervised(address: str, out: Path, log: Path, steps: int = STEPS) -> subprocess.Popen[bytes]:
    run = command("configs/jobs/quickstart.yaml", [*SETS, *ONE_OF_EACH, f"grpo.steps={steps}"])
    run += ["--out", str(out), "--address", address, "--queue", "research", "--requeue"]
    return subprocess.Popen(run, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=ROOT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import ray
    from ray.cluster_utils import Cluster

    from actors.cluster import NAMESPACE
    from actors.cluster_client import find_scheduler

    root = tmp_path_factory.mktemp("requeue")
    admin = root / "admin.yaml"
    admin.write_text(ADMIN)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 8})
    try:
        ray.init(address=c.address, namespace=NAMESPACE, log_to_driver=False)
        started = rlsched(
            "admin", "start", str(admin), "--address", c.address, "--state", str(root / "s.sqlite")
        )
        assert started.returncode == 0, started.stderr
        yield c.address, find_scheduler(), root
        rlsched("admin", "stop", "--address", c.address)
    finally:
        ray.shutdown()
        c.shutdown()


def test_a_killed_then_preempted_job_comes_back_each_time_and_rides_out_a_scheduler_restart(
    cluster: Any,
) -> None:
    import ray

    from actors.cluster import JobSpec
    from rlsched.policy.placement import Gang

    address, scheduler, root = cluster
    out, log = root / "rl", root / "rl.log"
    # long enough to be preempted: the preemption is asked for once attempt 2 has passed iteration 4,
    # and lands within a scheduler cycle and the job's current iteration (a second or two): it stopped
    # after iteration 7 on a quiet AMD EPYC, 7 short of the end; 30 steps spent 16 more after the resume
    steps = 14
    supervisor = _supervised(address, out, log, steps=steps)
    try:
        first = _attempt(supervisor)
        wait_for(lambda: committed(out) >= 2, "iteration 2", 300)
        time.sleep(0.3)  # into iteration 3
        os.kill(first, signal.SIGKILL)
        second = _attempt(supervisor, first)

        def second_past_four() -> bool:
            """Attempt 2 has committed iteration 4 itself: it logged an iteration after resuming (it
            rewrites metrics.jsonl to its checkpoint's rows first, so a count before that line may
            still be attempt 1's, which can have reached iteration 4 before the kill)."""
            text = log.read_text()
            resumed = text[text.find("resuming") :] if "resuming" in text else ""
            return re.search(r"^iter\s+\d+", resumed, re.MULTILINE) is not None and committed(out) >= 4

        wait_for(second_past_four, "attempt 2 past iteration 4", 300)
        evaluation = JobSpec("eval", "research", "high", (Gang(({"CPU": 8.0},)),))
        assert ray.get(scheduler.submit.remote(evaluation)) == ""
        wait_for(
            lambda: ray.get(scheduler.poll.remote("eval"))["state"] == "running", "eval to preempt it", 120
        )
        view = ray.get(scheduler.poll.remote("rl"))
        assert view["state"] == "pending"  # its reason: the quota eval holds, once a cycle has run
        _attempt(supervisor, second)  # the next attempt waits in the queue meanwhile
        time.sleep(2.0)
        ray.get(scheduler.finished.remote("eval"))
        wait_for(lambda: _iterating_after_resume(log, 2), "attempt 3 to resume and commit an iteration", 300)
        time.sleep(0.3)  # into its next iteration
        (killed,) = processes(TITLES[Fault.SCHEDULER])
        os.kill(killed, signal.SIGKILL)
        assert supervisor.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    text = log.read_text()
    assert re.search(r"attempt 1 ended after \d+ s \(killed by SIGKILL\); failed \(killed by SIGKILL\); "
                     r"retry 1 of 1 after a 1 s backoff", text), text[-4000:]  # fmt: skip
    assert re.search(r"attempt 2 ended after \d+ s \(stopped \(exit status 3\)\); preempted \(for eval", text)
    assert len(re.findall(r"resuming .* after iteration \d+, from the checkpoint of iteration", text)) == 2
    assert "Traceback" not in text
    assert check_run(out, steps, PROMPTS * GROUP) == []
    status = ray.get(scheduler.status.remote())  # the restarted scheduler, with its state
    assert status["restarted"] and status["error"] == ""
    job = status["jobs"]["rl"]
    assert job["state"] == "done" and job["failures"] == 1 and job["requeues"] == 2
    assert "attempt 3 ended" not in text and ", attempt 4)" not in text  # the restart requeued nothing


def _iterating_after_resume(log: Path, resumes: int) -> bool:
    """The log holds `resumes` resumes and an iteration line after the last."""
    text = log.read_text()
    found = [m.end() for m in re.finditer(r"^resuming .*$", text, re.MULTILINE)]
    return len(found) >= resumes and re.search(r"^iter\s+\d+", text[found[-1] :], re.MULTILINE) is not None


def test_a_job_whose_driver_keeps_dying_is_parked_with_the_reason(cluster: Any) -> None:
    import ray

    address, scheduler, root = cluster
    out, log = root / "crashes", root / "crashes.log"
    supervisor = _supervised(address, out, log)
    try:
        previous = None
        for n in (1, 2):
            pid = _attempt(supervisor, previous)
            again = ", attempt 2" if n == 2 else ""
            said = f"registered with the cluster scheduler as crashes (queue research{again})"
            wait_for(lambda s=said: s in log.read_text(), f"attempt {n} to register", 120)  # type: ignore[misc]
            os.kill(pid, signal.SIGKILL)
            previous = pid
        assert supervisor.wait(timeout=120) == 1
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    job = ray.get(scheduler.status.remote())["jobs"]["crashes"]
    assert job["state"] == "parked" and job["failures"] == 2
    assert "parked after 2 failures (the last: killed by SIGKILL)" in job["reason"]
    assert "the job is parked: parked after 2 failures" in log.read_text()

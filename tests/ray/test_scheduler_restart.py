"""The cluster scheduler survives its own death: killed (SIGKILL of its process) with three jobs
admitted and two pending, Ray restarts it on the head node, it takes back its state from SQLite and
the placement groups by name, and shows the same admissions, no job started twice, the same pending
reasons; callers' requests made while it was down are answered by the restarted actor."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.util import placement_group_table

from actors.cluster import JobSpec
from actors.cluster_client import start_scheduler, stop_scheduler
from rlsched.admin import admission_params, load_admin
from rlsched.policy.placement import Gang
from tests.helpers import ONE_NODE_ADMIN

pytestmark = pytest.mark.ray


def _live_groups() -> set[str]:
    return {g["name"] for g in placement_group_table().values() if g["state"] != "REMOVED"}


def _wait(check: Any, what: str, timeout_s: float = 60.0) -> Any:
    give_up = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.2)
    return got


def test_a_killed_scheduler_restarts_with_the_same_admissions(ray_session: None, tmp_path: Path) -> None:
    admin = tmp_path / "one.yaml"
    admin.write_text(ONE_NODE_ADMIN)
    params = admission_params(load_admin(admin))
    handle = start_scheduler(params, 0.2, {"research": "low"}, state=str(tmp_path / "scheduler.sqlite"))
    try:
        for k in range(5):  # 2.5 CPUs each: three fit in 8, two wait
            spec = JobSpec(f"job-{k}", "research", "low", (Gang(({"CPU": 2.5},)),))
            assert ray.get(handle.submit.remote(spec)) == ""

        def settled() -> dict[str, Any] | None:
            jobs = ray.get(handle.status.remote())["jobs"]
            running = [n for n, j in jobs.items() if j["state"] == "running"]
            return jobs if len(running) == 3 else None

        before = _wait(settled, "three admissions")
        groups_before = _live_groups()
        assert len(groups_before) == 3
        pending_before = {r["job"]: r["reason"] for r in ray.get(handle.queue.remote())}
        assert len(pending_before) == 2 and all(pending_before.values())

        os.kill(ray.get(handle.pid.remote()), signal.SIGKILL)
        status = ray.get(handle.status.remote())  # retried until the restarted actor answers
        assert status["restarted"] and status["error"] == ""
        after = status["jobs"]
        assert {n: j["state"] for n, j in after.items()} == {n: j["state"] for n, j in before.items()}
        assert {n: j["nodes"] for n, j in after.items()} == {n: j["nodes"] for n, j in before.items()}
        time.sleep(1.0)  # a few admission cycles of the restarted scheduler
        assert _live_groups() == groups_before  # no job started twice, none lost
        pending_after = {r["job"]: r["reason"] for r in ray.get(handle.queue.remote())}
        assert pending_after == pending_before
        view = ray.get(handle.poll.remote("job-0"))
        assert view["state"] in ("running", "pending") and (view["state"] != "running" or view["gangs"])
    finally:
        stop_scheduler()
    assert _live_groups() == set()

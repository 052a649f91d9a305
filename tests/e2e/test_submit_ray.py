"""`rlsched submit` through Ray's job API, on a cluster started as an admin starts one (`ray start
--head` with its dashboard): the job is registered with the cluster scheduler, runs as a Ray job on
the head node from the uploaded working directory, `rlsched status` shows Ray's job status beside the
scheduler's, and `rlsched logs` prints its output. The entrypoint is the job's supervisor (`rlsched run
--requeue`), which tests/e2e/test_requeue_ray.py puts through preemptions and kills."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ONE_NODE_ADMIN, ONE_OF_EACH, ROOT, wait_for

pytestmark = pytest.mark.ray


TOKEN = os.environ | {"RAY_AUTH_MODE": "token"}  # `ray start` clusters take only clients with the token


def rlsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlsched.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=180,
        env=TOKEN,
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A one-node cluster from `ray start --head` with the dashboard, its python the one we test with.

    Two things an admin's one cluster per machine does not need, and a test machine does: its job
    agent listens on a free port (Ray's default, 52365, is held by the agent of any other cluster on
    the machine, such as the embedded one of the vLLM job beside this lane, and then every submission
    is refused with "No available agent"), and it is stopped by its own processes, found by its temp
    directory (`ray stop` stops every Ray cluster on the machine)."""
    ray = str(Path(sys.executable).parent / "ray")
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RAY_AUTH_MODE": "token",
    }
    temp = tempfile.mkdtemp(prefix="rh-", dir="/tmp")  # short: Ray's socket paths are made under it
    env[MARK] = temp  # inherited by every process of the head, its workers and jobs among them
    port, dashboard, agent = _free_port(), _free_port(), _free_port()
    start = [ray, "start", "--head", f"--port={port}", "--num-cpus=8", "--include-dashboard=true",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
             f"--dashboard-agent-listen-port={agent}", f"--temp-dir={temp}",
             "--object-store-memory=300000000"]  # fmt: skip
    try:
        started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, started.stderr[-2000:]
        address = f"127.0.0.1:{port}"
        admin = tmp_path_factory.mktemp("admin") / "one.yaml"
        admin.write_text(ONE_NODE_ADMIN)
        scheduler = rlsched("admin", "start", str(admin), "--address", address)
        assert scheduler.returncode == 0, scheduler.stderr
        yield address
    finally:
        stop_processes_naming(temp)
        shutil.rmtree(temp, ignore_errors=True)


MARK = "RLSCHED_TEST_HEAD"


def stop_processes_naming(temp: str, grace_s: float = 3.0) -> None:
    """SIGTERM, then after `grace_s` SIGKILL, the head's processes: those started with `MARK=temp` in
    their environment, and the members of their process groups (the raylet starts its agents in its
    own group, with an environment of their own). Some of them outlast a SIGTERM by far (the test's
    teardown took the whole 10 s it once allowed): they get 3 s."""
    marker = f"{MARK}={temp}".encode()
    ours = os.getpgrp()

    def group_of(pid: int) -> int:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[2])

    def alive(groups: set[int]) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if entry.name.isdigit() and int(entry.name) != os.getpid():
                    environ = (entry / "environ").read_bytes().split(b"\0")
                    if marker in environ or group_of(int(entry.name)) in groups:
                        found.append(int(entry.name))
        return found

    groups: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for pid in alive(groups):
            with contextlib.suppress(OSError):
                groups.add(group_of(pid))
                os.kill(pid, sig)
        groups.discard(ours)
        give_up = time.monotonic() + wait_s
        while alive(groups) and time.monotonic() < give_up:
            time.sleep(0.2)


def test_submit_runs_the_job_through_rays_job_api(head: str, tmp_path: Path) -> None:
    out = tmp_path / "submitted"
    sets = [
        "grpo.steps=2",
        "eval.every_steps=2",
        "task.eval_size=64",
        "eval.curve_size=32",
        "grpo.prompts_per_step=8",
        *ONE_OF_EACH,
    ]
    proc = rlsched(
        "submit", "configs/jobs/quickstart.yaml", "--queue", "research", "--out", str(out), "--address", head,
        *[a for s in sets for a in ("--set", s)],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "as Ray job rlsched-submitted-" in proc.stdout

    def finished() -> str | None:
        shown = rlsched("status", "--json", "--address", head)
        state = json.loads(shown.stdout)["ray_jobs"].get("submitted", {}).get("status")
        return state if state in ("SUCCEEDED", "FAILED", "STOPPED") else None

    # Ray's status is asked through the CLI, a Ray driver connecting each time (about 2 s of a core,
    # taken from the job): every 30 s in case the job failed, and each second once the job's report,
    # its last output (a file, free to look at), is written: Ray's status follows it within seconds
    asked = [0.0]

    def ended() -> str | None:
        if not (out / "report.json").is_file() and time.monotonic() - asked[0] < 30:
            return None
        asked[0] = time.monotonic()
        return finished()

    assert wait_for(ended, "the Ray job to end", timeout_s=400, every_s=1.0) == "SUCCEEDED"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    logs = rlsched("logs", "submitted", "--address", head)
    assert logs.returncode == 0 and "held-out pass rate after" in logs.stdout
    assert "supervising submitted" in logs.stdout  # the entrypoint requeues it after a preemption or failure
    shown = rlsched("status", "--address", head)
    assert "(Ray job rlsched-submitted-" in shown.stdout and "SUCCEEDED" in shown.stdout

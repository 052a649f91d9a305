"""Where `rlsched scale` finds a job (`rlsched/job/registry.py`): the job's driver records its cluster under
Ray's temporary root; a record whose driver is gone, or another driver's, is not taken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.cli_commands import send_ray_token_if_present
from rlsched.job.registry import jobs_dir, record_job, recorded, recorded_jobs


@pytest.fixture(autouse=True)
def own_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    return tmp_path


def test_a_running_job_is_found_by_name_and_forgotten_when_it_ends(own_root: Path) -> None:
    forget = record_job("elastic", "192.0.2.2:6379")
    assert jobs_dir() == own_root / "rlsched-jobs"
    assert recorded("elastic") == "192.0.2.2:6379" and recorded("other") is None
    assert recorded_jobs() == ["elastic"]
    forget()
    assert recorded("elastic") is None and recorded_jobs() == []


def test_a_record_whose_driver_died_is_not_taken() -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    path = jobs_dir() / "killed.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"job": "killed", "address": "192.0.2.2:6379", "pid": int(dead.stdout)}))
    assert recorded("killed") is None and recorded_jobs() == []
    path.write_text("{not json")
    assert recorded("killed") is None


def test_a_driver_forgets_only_its_own_record() -> None:
    forget = record_job("run", "192.0.2.2:1111")
    path = jobs_dir() / "run.json"
    path.write_text(json.dumps({"job": "run", "address": "192.0.2.2:2222", "pid": 1}))  # a later driver's
    forget()
    assert path.exists()


def test_the_token_is_sent_only_where_the_user_has_not_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "")  # so that the test's own setting is undone after it
    monkeypatch.delenv("RAY_AUTH_MODE")
    send_ray_token_if_present()
    assert "RAY_AUTH_MODE" not in os.environ  # no token: nothing to send
    token.write_text("secret")
    send_ray_token_if_present()
    assert os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    send_ray_token_if_present()
    assert os.environ["RAY_AUTH_MODE"] == "disabled"

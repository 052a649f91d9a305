"""Bad pipelined settings are refused before anything starts, naming the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.config import load_config
from rlsched.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs/jobs/quickstart.yaml"
ASYNC = ("--set", "schedule.mode=async", "--set", "rollout.max_staleness=1")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["schedule.mode=async"], "mode async with rollout.max_staleness 0 cannot overlap anything"),
        (
            ["schedule.mode=async", "rollout.max_staleness=1", "schedule.buffer_groups=8"],
            r"schedule.buffer_groups 8 is smaller than one batch \(32 groups\).*at least 32",
        ),
    ],
)
def test_a_pipeline_that_cannot_run_is_refused(settings: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_config(QUICKSTART, settings)


def test_local_refuses_async_with_the_fix() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rlsched.cli", "run", str(QUICKSTART), "--local", *ASYNC],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2 and "drop --local, or set schedule.mode sync" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("settings", "swaps", "fallback"),
    [
        ([], False, None),
        (["rollout.inflight_update=swap"], True, None),
        (
            ["rollout.inflight_update=swap", "engine.kind=vllm"],
            False,
            "engine vllm loads a version only between",
        ),
        (["engine.kind=vllm"], False, None),
    ],
)
def test_in_flight_swaps_reach_the_fleet_core_only_where_the_engine_can_swap(
    settings: list[str], swaps: bool, fallback: str | None
) -> None:
    from rlsched.config_params import fleet_params, swap_fallback

    cfg = load_config(QUICKSTART, ["schedule.mode=async", "rollout.max_staleness=1", *settings])
    assert fleet_params(cfg).swap_in_flight is swaps
    reason = swap_fallback(cfg)
    assert (reason is None) if fallback is None else (reason is not None and fallback in reason)
    if reason is not None:
        assert "finish on the old version" in reason


def test_an_unknown_in_flight_behaviour_is_refused_with_the_choices() -> None:
    with pytest.raises(UserError, match=r"finish.*swap"):
        load_config(QUICKSTART, ["rollout.inflight_update=pause"])


def test_a_fleet_of_engines_that_cannot_swap_says_why_it_finishes_on_the_old_version() -> None:
    import time

    from actors.fleet import Fleet

    logged: list[str] = []
    sets = ["schedule.mode=async", "rollout.max_staleness=1", "rollout.inflight_update=swap"]
    cfg = load_config(QUICKSTART, [*sets, "engine.kind=vllm"])
    fleet = Fleet(cfg, None, None, [], time.monotonic, logged.append)
    assert not fleet.core.params.swap_in_flight
    assert len(logged) == 1 and "engine vllm loads a version only between generate calls" in logged[0]
    Fleet(load_config(QUICKSTART, sets), None, None, [], time.monotonic, logged.append)
    assert len(logged) == 1  # the torch engine swaps: nothing to say

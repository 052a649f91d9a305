"""The trackers a job feeds, on real files and sockets: TensorBoard event files read back by
TensorBoard's own reader (a resumed run's redone steps hidden), a Prometheus scrape of the driver's
`/metrics`, and a port that cannot be served refused as bad input."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlsched.config import TrackingConfig
from rlsched.errors import UserError
from rlsched.metrics.tracking import Tracking, flatten


def _row(i: int) -> dict:
    return {
        "iteration": i,
        "version": i - 1,
        "reward_mean": 0.1 * i,
        "loss": -0.5 / i,
        "eval_pass_rate": None,
        "t_generate": 0.5,
        "t_iter": 1.0,
        "extra": {"fleet": {"joined": 2, "replaced": i // 3}, "serving": ["rollout-0"]},
    }


def test_rows_flatten_to_scalars() -> None:
    flat = flatten(_row(3))
    assert flat["reward_mean"] == pytest.approx(0.3) and flat["extra/fleet/replaced"] == 1.0
    assert "eval_pass_rate" not in flat and not any(k.startswith("extra/serving") for k in flat)


def _scalars(directory: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(directory))
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]


def test_tensorboard_events_are_readable_and_a_resume_hides_the_redone_steps(tmp_path: Path) -> None:
    first = Tracking(TrackingConfig(), tmp_path, {"seed": 0})
    for i in range(1, 6):
        first.log(_row(i), i, {"commit_seconds": 0.002})
    first.close()
    assert _scalars(tmp_path / "tensorboard", "reward_mean") == [(i, round(0.1 * i, 6)) for i in range(1, 6)]
    resumed = Tracking(TrackingConfig(), tmp_path, {"seed": 0}, first_step=4)  # resumed after 3
    for i in (4, 5):
        row = _row(i) | {"reward_mean": 9.0}
        resumed.log(row, i)
    resumed.close()
    steps = _scalars(tmp_path / "tensorboard", "reward_mean")
    assert steps == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 9.0), (5, 9.0)]
    assert _scalars(tmp_path / "tensorboard", "commit_seconds")[0] == (1, 0.002)


def test_prometheus_scrape_shows_the_newest_row(tmp_path: Path) -> None:
    tracking = Tracking(TrackingConfig(tensorboard=False, prometheus_port=0), tmp_path, {})
    try:
        assert tracking.prometheus is not None
        tracking.log(_row(7), 7, {"recoveries_total": 1.0})
        body = urllib.request.urlopen(tracking.prometheus.address, timeout=10).read().decode()
    finally:
        tracking.close()
    assert "rlsched_iteration 7.0" in body
    assert "rlsched_reward_mean 0.7" in body
    assert 'rlsched_phase_seconds{phase="t_generate"} 0.5' in body
    assert "rlsched_recoveries_total 1.0" in body


def test_a_port_that_cannot_be_served_is_refused(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"prometheus_port {port}"):
            Tracking(TrackingConfig(tensorboard=False, prometheus_port=port), tmp_path, {})


def test_wandb_asked_for_but_not_installed_is_bad_input(tmp_path: Path) -> None:
    try:
        import wandb  # noqa: F401

        pytest.skip("wandb is installed here")
    except ImportError:
        pass
    with pytest.raises(UserError, match="pip install wandb"):
        Tracking(TrackingConfig(tensorboard=False, wandb=True), tmp_path, {})

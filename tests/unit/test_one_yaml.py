"""One YAML, one iteration: every job config the project ships gives the simulator's job
(`rlsched.sim.scenario.sim_job_of`) the iteration core parameters the Ray driver and `--local` build
from it (`rlsched.config_params.pipeline_params`), its batch names aside: the simulator's scenario
reuses the job's sections instead of a hand-kept copy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rlsched.config import load_config
from rlsched.config_params import pipeline_params
from rlsched.sim.rljob import sim_pipeline_params
from rlsched.sim.scenario import sim_job_of
from tests.helpers import ROOT

JOBS = sorted((ROOT / "configs" / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_the_simulator_builds_the_iteration_the_job_config_describes(path: Path) -> None:
    cfg = load_config(path)
    job = sim_job_of(cfg, "sim")
    params = sim_pipeline_params(job)
    assert (params.batch_prefix, params.kind) == ("sim/iter-", "sim")
    assert replace(params, batch_prefix="iter-", kind="default") == pipeline_params(cfg)
    assert job.iterations == cfg.grpo.steps and job.instances == cfg.rollout.instances


def test_async_settings_reach_the_simulated_job() -> None:
    cfg = load_config(
        None,
        [
            "schedule.mode=async",
            "rollout.max_staleness=2",
            "schedule.buffer_groups=16",
            "grpo.prompts_per_step=8",
        ],
    )
    params = sim_pipeline_params(sim_job_of(cfg))
    assert (params.mode.value, params.max_staleness, params.buffer_groups, params.ahead) == (
        "async",
        2,
        16,
        2,
    )

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


def test_a_scenario_job_takes_its_iteration_from_a_job_config(tmp_path: Path) -> None:
    """`config:` in a scenario's job: the job config's sections decide its iteration (as `sim_job_of`
    reads them), the scenario adds the durations and may shorten the run; a key the job config
    decides is refused, naming the job's key, and so is a missing file."""
    from rlsched.errors import UserError
    from rlsched.sim.scenario import load_scenario

    job = tmp_path / "jobs" / "async.yaml"
    job.parent.mkdir()
    job.write_text("schedule: {mode: async}\nrollout: {max_staleness: 2, request_batch: 8}\n")
    scenario = tmp_path / "scenarios" / "s.yaml"
    scenario.parent.mkdir()
    scenario.write_text(
        "cluster: {gpus: 8}\njobs:\n"
        "  - {name: a, config: ../jobs/async.yaml, iterations: 3, generate_s: 0.2}\n"
    )
    simulated = load_scenario(scenario).jobs[0]
    expected = sim_job_of(load_config(job), "a", iterations=3, generate_s=0.2)
    assert simulated.config == scenario.parent / "../jobs/async.yaml"
    assert simulated.model_dump(exclude={"config"}) == expected.model_dump(exclude={"config"})
    assert (simulated.mode.value, simulated.max_staleness, simulated.request_batch) == ("async", 2, 8)
    with pytest.raises(UserError, match=r"overlap is decided by the job config .*\(schedule.overlap\)"):
        load_scenario(scenario, ["jobs.0.overlap=false"])
    with pytest.raises(UserError, match=r"job config .*nope\.yaml does not exist"):
        load_scenario(scenario, ["jobs.0.config=nope.yaml"])

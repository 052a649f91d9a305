"""The single-process GRPO loop really learns, and never scores an unjudged sample zero."""

from __future__ import annotations

import pytest

from rlsched.config import load_config
from rlsched.rl.loop import GRPOLoop
from verifiers.exact_answer import ExactAnswerVerifier
from verifiers.protocol import Outcome, VerifyRequest

SMALL = ["task.eval_size=128", "eval.curve_size=64", "grpo.prompts_per_step=16", "eval.every_steps=100"]


@pytest.mark.slow
def test_a_few_grpo_steps_raise_the_held_out_pass_rate() -> None:
    loop = GRPOLoop(load_config(None, [*SMALL, "grpo.steps=12"]), log=lambda _: None)
    report = loop.run()
    assert report.after.carry_pass_rate > report.before.carry_pass_rate + 0.2
    assert report.after.pass_rate > report.before.pass_rate + 0.1
    assert [s.version for s in report.steps] == list(range(1, 13))
    assert loop.engine.version == 12


class _FlakyVerifier:
    """Crashes on the first attempt of every third sample; a retry succeeds."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0
        self.inner = ExactAnswerVerifier()

    def verify(self, request: VerifyRequest) -> Outcome:
        self.calls += 1
        if request.attempt == 0 and sum(map(ord, request.sample_id)) % 3 == 0:
            raise RuntimeError("verifier process died")
        return self.inner.verify(request)


class _DeadVerifier:
    name = "dead"

    def verify(self, request: VerifyRequest) -> Outcome:
        raise RuntimeError("always down")


def test_faults_are_retried_then_judged() -> None:
    verifier = _FlakyVerifier()
    loop = GRPOLoop(
        load_config(None, [*SMALL, "grpo.prompts_per_step=4"]), verifier=verifier, log=lambda _: None
    )
    rec = loop.step(0)
    assert rec.faults == 0
    assert verifier.calls > 4 * 8  # retries happened


def test_unjudgeable_groups_are_left_out_not_scored_zero() -> None:
    loop = GRPOLoop(
        load_config(None, [*SMALL, "grpo.prompts_per_step=4", "grpo.verify_retries=1"]),
        verifier=_DeadVerifier(),
        log=lambda _: None,
    )
    before = {k: v.clone() for k, v in loop.policy.state_dict().items()}
    rec = loop.step(0)
    assert rec.faults == 4 * 8
    assert rec.loss == 0.0
    after = loop.policy.state_dict()
    assert all((before[k] == after[k]).all() for k in before)  # no update from unjudged samples


def test_the_local_loop_builds_its_iteration_core_from_the_config_as_the_ray_controller_does() -> None:
    """One YAML, three drivers, the same iteration: `--local` builds its core with `pipeline_params`,
    as the Ray driver does (`rlsched.job.iterations`), and the simulator's job made from the same config
    (`sim_job_of`) builds equal parameters, its batch names aside; so `schedule.overlap` and the
    training group's cost rate reach every one (`--local` dropped both before issue 42) and sync mode
    is the pipeline run zero versions ahead."""
    from dataclasses import replace

    from rlsched.config_params import pipeline_params, training_devices
    from rlsched.policy.versions import PipelineMode
    from rlsched.sim.rljob import sim_pipeline_params
    from rlsched.sim.scenario import sim_job_of

    cfg = load_config(None, [*SMALL, "schedule.overlap=false", "trainer.ranks=2", "rollout.max_staleness=1"])
    loop = GRPOLoop(cfg, log=lambda _: None)
    params = loop.core.params
    assert params == pipeline_params(cfg)
    simulated = sim_pipeline_params(sim_job_of(cfg, "job"))
    assert replace(simulated, batch_prefix="iter-", kind="default") == params
    assert params.overlap is False and params.cost_rate == training_devices(cfg.trainer) == 2.0
    assert params.mode is PipelineMode.SYNC and params.ahead == 0 and params.max_staleness == 1
    record = loop.step(0)  # the sequential baseline: every sample verified once generation ends
    assert record.step == 1 and record.version == 1


def test_local_serves_the_endpoint_and_trains_its_clients_episodes() -> None:
    """`rlsched run --local` with the endpoint on (the sync single-turn torch cell of the modes
    matrix): the server runs on the loop's engine, a client's rewarded group and an episode with a
    reference, which the job's verifier judges beside the wave's samples, join the step's batch."""
    from tests.helpers import JobEndpoint

    cfg = load_config(
        None, [*SMALL, "grpo.prompts_per_step=4", "rollout.endpoint.enabled=true", "rollout.endpoint.port=0"]
    )
    lines: list[str] = []
    loop = GRPOLoop(cfg, log=lines.append)
    try:
        client = JobEndpoint(lines)
        client.episode("c-0", "c", 1.0)
        client.episode("c-1", "c", 0.0)
        client.episode("r-0", "r", reference="1234567")  # no reward: the verifier's to give
        rec = loop.step(0)
    finally:
        loop.close()
    assert rec.endpoint is not None, lines
    assert rec.endpoint["episodes_judged"] == 1 and rec.endpoint["episodes_trained"] == 3, rec.endpoint
    assert rec.endpoint["episodes_unjudged"] == 0 and rec.version == 1

"""Simulator scenarios (`configs/scenarios/*.yaml`): the cluster, the verifier pool every job shares,
the jobs (their distributions, weight link, transient instances), the policies and seeds; typed and
validated once like a job config, with the same loader (`--set`, errors by dotted path).

A scenario's job may take its iteration from a job config (`config: ../jobs/quickstart.yaml`): its
`grpo` batch and steps, `rollout` instances, request batch and staleness bound, `schedule` mode,
buffer and overlap, and the training group's devices, read from the job's own sections
(`sim_job_of`) instead of copied by hand; the scenario adds what only the simulator models (the
durations, token counts, slots, weight link) and may shorten the run (`iterations`). A key the job
config decides is refused there, naming the job's key to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, model_validator

from rlsched.config import JobConfig, TransientInstance, load_config
from rlsched.config_load import Section, load_tree
from rlsched.config_params import training_devices
from rlsched.config_verifier import TimeoutConfig
from rlsched.errors import UserError
from rlsched.policy.bandwidth import RelayParams
from rlsched.policy.routing import Refill
from rlsched.policy.verify import DispatchPolicy
from rlsched.policy.versions import PipelineMode, pipeline_problem
from rlsched.sim.dists import Constant, Distribution, Uniform


class SimClusterConfig(Section):
    """What the simulated cluster has; the jobs and the verifier pool must fit in it."""

    gpus: int = Field(8, ge=0, description="accelerators (the quickstart's 'GPUs' are CPU processes)")
    cpus: int = Field(64, ge=0, description="CPUs (the verifier pool's workers take theirs from here)")


class SimPoolConfig(Section):
    """The verifier pool every job's samples share: CPU workers, and GPU workers for a GPU stage."""

    cpu_workers: int = Field(4, ge=1, description="workers for the CPU stage of each verification")
    cpus_per_worker: int = Field(1, ge=1, description="CPUs each verifier worker holds")
    gpu_workers: int = Field(0, ge=0, description="workers holding one GPU each, for the GPU stage")
    autoscale: bool = Field(
        False, description="distrs only: resize the pool over time by advise_pool (history-based scaling)"
    )
    scale_interval_s: float = Field(1.0, gt=0, description="how often the pool size is reconsidered")
    start_s: float = Field(0.0, ge=0, description="seconds a worker added by scaling takes to start")
    worker_cost: float = Field(
        1.0, ge=0, description="one worker-second against one idle device-second of a training group"
    )
    order_generation: bool = Field(
        True,
        description="distrs only: each job generates the problems with the longest expected "
        "verification first",
    )
    preempt: bool = Field(
        False,
        description="distrs only: urgent work may stop a running verification of a batch whose "
        "training group costs less idle (it reruns from the start later)",
    )
    verify_retries: int = Field(
        2, ge=0, description="retries of a timed-out verification (as grpo.verify_retries)"
    )
    timeout: TimeoutConfig = Field(
        TimeoutConfig(), description="adaptive verification timeouts, the runtime's verifier.timeout"
    )


class SimWeightsConfig(Section):
    """A job's weight link (SPEC section 2): every instance pulls each version's `bytes` through the
    trainer's shared egress under its own ingress cap, then loads it for `load_s`."""

    bytes: float = Field(gt=0, description="bytes of one version")
    egress_gbps: float = Field(gt=0, description="the trainer's shared egress, Gbit/s")
    receiver_gbps: float = Field(gt=0, description="each instance's ingress cap, Gbit/s")
    load_s: float = Field(0.0, ge=0, description="load and confirm, after the transfer")
    relay: bool = Field(
        False, description="instances relay each version to their peers (the fleet core's plan)"
    )
    upload_gbps: float | None = Field(
        None, ge=0, description="each instance's upload when relaying, Gbit/s; unset: receiver_gbps"
    )
    chunk_kb: int = Field(4096, ge=4, description="the relays' chunk, KiB (a hop's store-and-forward delay)")

    @model_validator(mode="after")
    def _relay_uploads(self) -> SimWeightsConfig:
        self.relay_params()  # `RelayParams` refuses an upload of 0, naming the fix
        return self

    def relay_params(self) -> RelayParams | None:
        if not self.relay:
            return None
        upload = self.upload_gbps if self.upload_gbps is not None else self.receiver_gbps
        return RelayParams(upload * 1e9, self.egress_gbps * 1e9, self.chunk_kb << 10)


class SimTransientConfig(TransientInstance):
    """`count` transient instances with one window, as the runtime's `rollout.transient` has them:
    granted `join_at_s` into iteration `join_iteration`'s generation, reclaimed `available_s` after
    their grant (or `reclaim_at_s` into iteration `reclaim_iteration`'s generation)."""

    count: int = Field(1, ge=1, description="instances granted together")


class SimResumeConfig(Section):
    """Pricing a reclaimed sample's resume (prefill of prompt + saved tokens) against a restart."""

    prompt_tokens: float = Field(0.0, ge=0, description="prompt tokens a resumed request prefills again")
    prefill_tokens_per_s: float = Field(5000.0, gt=0, description="prefill speed when resuming")
    setup_s: float = Field(0.0, ge=0, description="fixed seconds to resume one request")


class SimJobConfig(Section):
    """One RL job: generate on instances, verify (CPU stage, then an optional GPU stage), update, publish.

    Generation time per sample is `generate_s`, or `tokens / tokens_per_s` when both are given. With
    `weights`, instances pull every version over the modelled link and `transient` instances come
    and go (`rlsched.sim.fleet`).
    """

    config: Path | None = Field(
        None,
        description="a job config whose grpo, rollout, schedule and trainer sections make this job's "
        "iteration (relative: the scenario's dir); the keys they decide are then not set here",
    )
    name: str = Field("job", min_length=1, description="the job's name in spans and reports")
    iterations: int = Field(10, ge=1, description="iterations to run")
    samples: int = Field(256, ge=1, description="samples per iteration")
    instances: int = Field(2, ge=1, description="rollout instances")
    gpus_per_instance: int = Field(1, ge=0, description="devices each rollout instance holds")
    slots: int = Field(64, ge=1, description="sequences one instance generates at once (its batch)")
    request_batch: int | None = Field(
        None,
        ge=1,
        description="requests handed to an idle instance at a time, as rollout.request_batch (unset: slots)",
    )
    refill: Refill = Field(
        Refill.SLOT,
        description="when an instance's freed rows take more requests: slot (once refill_min are free) "
        "or batch (request_batch more once its last route has ended), as rollout.refill",
    )
    refill_min: int = Field(
        4, ge=1, description="refill slot: rows free before an instance takes more, as rollout.refill_min"
    )
    max_staleness: int = Field(0, ge=0, description="versions an instance may lag the latest, as rollout's")
    mode: PipelineMode = Field(
        PipelineMode.SYNC,
        description="sync: one iteration after another; async: generation runs ahead of training by up "
        "to max_staleness versions (rlsched.core.pipeline)",
    )
    buffer_groups: int | None = Field(
        None, ge=1, description="async: judged groups that may wait for the trainer (unset: one batch)"
    )
    trainer_gpus: int = Field(2, ge=0, description="devices of the training group (what its idling costs)")
    generate_s: Distribution | None = Field(
        None, description="seconds to generate one sample (unset: tokens / tokens_per_s)"
    )
    tokens: Distribution | None = Field(None, description="generated tokens per sample")
    tokens_per_s: Distribution | None = Field(None, description="decode speed of one sequence")
    verify_cpu_s: Distribution = Field(
        Constant(value=0.01), description="seconds of a problem's CPU-stage verification"
    )
    verify_gpu_s: Distribution | None = Field(None, description="a GPU stage after the CPU stage")
    update_s: Distribution = Field(Constant(value=0.5), description="seconds of the update")
    update_tokens_per_s: float | None = Field(
        None, gt=0, description="if set, the update also takes the batch's tokens / this rate"
    )
    publish_s: Distribution = Field(Constant(value=0.01), description="seconds to publish a version")
    overlap: bool = Field(True, description="verify while generating (false: the sequential baseline)")
    group_size: int = Field(1, ge=1, description="samples per problem in an iteration (GRPO's group)")
    problems: int | None = Field(
        None, ge=1, description="dataset size: problems recur across iterations (none: always new ones)"
    )
    verify_spread: float = Field(
        0.0, ge=0, description="sigma of a sample's lognormal factor around its problem's verify time"
    )
    verify_slots: int = Field(
        1, ge=1, description="CPU workers each verification needs at once (a gang verifier: all or none)"
    )
    weights: SimWeightsConfig | None = None
    transient: tuple[SimTransientConfig, ...] = ()
    resume: SimResumeConfig = SimResumeConfig()

    @model_validator(mode="before")
    @classmethod
    def _from_job_config(cls, data: Any, info: ValidationInfo) -> Any:
        """`config`: the job config's iteration, with this entry's simulator-only keys on top."""
        if not isinstance(data, dict) or data.get("config") is None:
            return data
        path = Path(data["config"])
        if not path.is_absolute():
            path = Path((info.context or {}).get("base_dir", ".")) / path
        if not path.is_file():
            raise ValueError(f"config: job config {path} does not exist")
        decided = sorted(JOB_DECIDES.keys() & data.keys())
        if decided:
            keys, theirs = ", ".join(decided), ", ".join(JOB_DECIDES[k] for k in decided)
            one = len(decided) == 1
            raise ValueError(
                f"{keys} {'is' if one else 'are'} decided by the job config {path} ({theirs}): change "
                f"{'it' if one else 'them'} there, or drop config and give every key here"
            )
        try:
            cfg = load_config(path)
        except UserError as err:
            raise ValueError(f"config: {err}") from None
        return job_fields(cfg, str(data.get("name", "job"))) | data | {"config": path}

    @model_validator(mode="after")
    def _elastic_needs(self) -> SimJobConfig:
        if self.transient and self.weights is None:
            raise ValueError("transient instances need weights (bytes, egress_gbps, receiver_gbps) to join")
        if self.weights is not None and self.tokens is None:
            raise ValueError(
                "weights (elastic generation) needs the token model (tokens and tokens_per_s), "
                "so that a reclaimed sample's saved tokens can be priced"
            )
        return self

    @model_validator(mode="after")
    def _groups_divide(self) -> SimJobConfig:
        if self.samples % self.group_size:
            raise ValueError(f"samples ({self.samples}) must be a multiple of group_size ({self.group_size})")
        if self.problems is not None and self.problems < self.samples // self.group_size:
            raise ValueError(
                f"problems ({self.problems}) must cover one iteration's {self.samples // self.group_size} "
                "problems (samples / group_size)"
            )
        return self

    @model_validator(mode="after")
    def _one_generation_model(self) -> SimJobConfig:
        by_tokens = self.tokens is not None or self.tokens_per_s is not None
        if by_tokens and (self.tokens is None or self.tokens_per_s is None):
            raise ValueError("give both tokens and tokens_per_s (generation time = tokens / tokens_per_s)")
        if by_tokens == (self.generate_s is not None):
            raise ValueError("give generate_s, or tokens and tokens_per_s, but not both")
        if self.update_tokens_per_s is not None and not by_tokens:
            raise ValueError("update_tokens_per_s needs the token model (tokens and tokens_per_s)")
        return self

    @model_validator(mode="after")
    def _pipeline(self) -> SimJobConfig:
        problem = pipeline_problem(
            self.mode, self.max_staleness, self.buffer, self.samples // self.group_size
        )
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def buffer(self) -> int:
        """The async buffer's size in groups."""
        return self.buffer_groups if self.buffer_groups is not None else self.samples // self.group_size

    @property
    def gpus(self) -> int:
        transient = sum(t.count for t in self.transient)  # at their peak they all hold one
        return self.trainer_gpus + (self.instances + transient) * self.gpus_per_instance


# a simulated job's keys that a job config decides (`config`), and the job config's key for each
JOB_DECIDES = {
    "samples": "grpo.prompts_per_step x grpo.group_size",
    "group_size": "grpo.group_size",
    "instances": "rollout.instances",
    "request_batch": "rollout.request_batch",
    "refill": "rollout.refill",
    "refill_min": "rollout.refill_min",
    "max_staleness": "rollout.max_staleness",
    "mode": "schedule.mode",
    "buffer_groups": "schedule.buffer_groups",
    "overlap": "schedule.overlap",
    "trainer_gpus": "trainer's devices",
}


def job_fields(cfg: JobConfig, name: str) -> dict[str, Any]:
    """What a job config decides of a simulated job (`JOB_DECIDES`), and its steps as the run's
    iterations."""
    return {
        "name": name,
        "iterations": cfg.grpo.steps,
        "samples": cfg.grpo.prompts_per_step * cfg.grpo.group_size,
        "group_size": cfg.grpo.group_size,
        "instances": cfg.rollout.instances,
        "request_batch": cfg.rollout.request_batch,
        "refill": cfg.rollout.refill,
        "refill_min": cfg.rollout.refill_min,
        "max_staleness": cfg.rollout.max_staleness,
        "mode": cfg.schedule.mode,
        "buffer_groups": cfg.schedule.buffer_groups,
        "overlap": cfg.schedule.overlap,
        "trainer_gpus": int(training_devices(cfg.trainer)),
    }


def sim_job_of(cfg: JobConfig, name: str = "job", **draws: Any) -> SimJobConfig:
    """A job config's iteration, as a simulated job: the same sections (`job_fields`), with `draws`
    for what only the simulator models (durations, token counts; a second a sample unless given)."""
    fields = job_fields(cfg, name)
    if not {"generate_s", "tokens", "tokens_per_s"} & set(draws):
        fields["generate_s"] = Constant(value=1.0)
    return SimJobConfig(**(fields | draws))


class ScenarioConfig(Section):
    cluster: SimClusterConfig = SimClusterConfig()
    pool: SimPoolConfig = SimPoolConfig()
    jobs: tuple[SimJobConfig, ...] = (SimJobConfig(generate_s=Uniform(low=0.1, high=0.5)),)
    policies: tuple[DispatchPolicy, ...] = Field(
        (DispatchPolicy.FIFO,), description="dispatch policies to compare, each run on the same seeds"
    )
    seeds: int = Field(5, ge=1, description="seeds per policy (figures are over all of them)")

    @model_validator(mode="after")
    def _fits(self) -> ScenarioConfig:
        if not self.jobs:
            raise ValueError("jobs: a scenario needs at least one job")
        names = [j.name for j in self.jobs]
        if len(set(names)) < len(names):
            raise ValueError(f"jobs: names must differ (got {', '.join(names)}); set jobs.N.name")
        too_wide = [j for j in self.jobs if j.verify_slots > self.pool.cpu_workers]
        if too_wide:
            raise ValueError(
                f"jobs.{self.jobs.index(too_wide[0])}.verify_slots is {too_wide[0].verify_slots} but the "
                f"pool has {self.pool.cpu_workers} CPU workers; a gang verification could never start"
            )
        gpu_stage = [j.name for j in self.jobs if j.verify_gpu_s is not None]
        if gpu_stage and self.pool.gpu_workers == 0:
            raise ValueError(
                f"pool.gpu_workers is 0 but job {gpu_stage[0]} has a GPU verification stage "
                "(verify_gpu_s); give the pool GPU workers or drop the stage"
            )
        need = sum(j.gpus for j in self.jobs) + self.pool.gpu_workers
        if need > self.cluster.gpus:
            parts = [
                f"{j.name} {j.trainer_gpus} trainer + {j.instances}x{j.gpus_per_instance}" for j in self.jobs
            ]
            raise ValueError(
                f"cluster.gpus is {self.cluster.gpus} but the scenario needs {need} "
                f"({'; '.join(parts)} rollout; pool {self.pool.gpu_workers}); "
                "raise cluster.gpus or ask for fewer"
            )
        cpus = self.pool.cpu_workers * self.pool.cpus_per_worker
        if cpus > self.cluster.cpus:
            raise ValueError(
                f"cluster.cpus is {self.cluster.cpus} but the pool needs {cpus} "
                f"({self.pool.cpu_workers} workers x {self.pool.cpus_per_worker}); "
                "raise cluster.cpus or lower pool.cpu_workers"
            )
        return self


def load_scenario(path: Path | str | None, overrides: list[str] | None = None) -> ScenarioConfig:
    """A scenario file (`configs/scenarios/*.yaml`); empirical files are read relative to it."""
    return load_tree(ScenarioConfig, path, overrides)

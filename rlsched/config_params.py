"""A job's config in the cores' terms, translated once: its demand on the cluster and its iteration's
parameters.

The demand: the bundle each training rank, rollout instance and verifier worker holds, and the
devices its training group leaves idle while a batch is incomplete.

The cluster scheduler's gangs (`job_spec`), the capacity check before a job starts
(`required_resources`), the trainer's own placement group (`actors.trainer.reserve_gang`), the
actors themselves (`actors.fleet`, `actors.pool`, through `actors.demand.actor_options`) and the
iteration's cost rate (`training_devices`) all take their figures from here, so what a job is
admitted for is what its actors ask Ray for.

The fleet's and the verifier pool's (`fleet_params`, `pool_params`) and where the partial-output
store lives (`store_path`).

The iteration (`pipeline_params`): what the iteration's core is built with, by every driver of it
(the Ray controller, `--local`), so that one YAML runs the same iteration under each, `overlap` and
the cost rate included.

It translates the config into the cores' vocabulary (`JobSpec`, bundles, `PipelineParams`), so it
sits beside the config rather than in `rlsched.core`, which never reads the config (the import
contract in pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlsched.config import JobConfig, RolloutConfig, TrainerConfig
from rlsched.config_verifier import VerifierConfig
from rlsched.core import fleet_io as fx
from rlsched.core import verify_pool_io as vx
from rlsched.core.cluster_io import JobSpec
from rlsched.core.pipeline import PipelineParams
from rlsched.policy.placement import Gang, Strategy, add
from rlsched.policy.resume import ResumeCost
from rlsched.policy.retry import RetryPolicy
from rlsched.policy.run_rules import RunRules
from rlsched.policy.verify import VerifyParams
from rlsched.policy.versions import InflightUpdate, swap_refusal

Bundle = dict[str, float]


def rank_bundle(t: TrainerConfig) -> Bundle:
    """One training rank: its CPUs, its GPUs if any, and `trainer.resources`."""
    bundle: Bundle = {"CPU": t.cpus_per_rank, **t.resources}
    if t.gpus_per_rank:
        bundle["GPU"] = t.gpus_per_rank
    return bundle


def instance_bundle(r: RolloutConfig) -> Bundle:
    """One rollout instance (static, transient, scaled or elastic): its CPUs and `rollout.resources`."""
    return {"CPU": r.cpus_per_instance, **r.resources}


def worker_bundle(v: VerifierConfig, gpu: bool = False) -> Bundle:
    """One verifier worker: `verifier.cpus_per_worker` CPUs, or a GPU stage's one CPU and one GPU."""
    return {"CPU": 1.0, "GPU": 1.0} if gpu else {"CPU": v.cpus_per_worker}


def training_devices(t: TrainerConfig) -> float:
    """The devices the training group holds, left idle while its batch is incomplete (a CPU-only
    rank counts as one): the cost rate the verifier pool's dispatch policy weighs batches by."""
    return float(t.ranks * max(1, t.gpus_per_rank))


def pipeline_params(cfg: JobConfig) -> PipelineParams:
    """The iteration's core parameters: a step's GRPO groups, the buffer (`schedule.buffer_groups`,
    unset: one batch), the staleness bound, the mode, overlap and the training group's cost rate."""
    batch = cfg.grpo.prompts_per_step
    return PipelineParams(
        batch_groups=batch,
        group_size=cfg.grpo.group_size,
        max_staleness=cfg.rollout.max_staleness,
        buffer_groups=cfg.schedule.buffer_groups or batch,
        overlap=cfg.schedule.overlap,
        cost_rate=training_devices(cfg.trainer),
        mode=cfg.schedule.mode,
    )


def run_rules(cfg: JobConfig) -> RunRules:
    """The job's run rules: its step limit, time budget, evaluation and checkpoint cadences."""
    return RunRules(cfg.grpo.steps, cfg.grpo.time_budget_s, cfg.eval.every_steps, cfg.checkpoint.every)


def job_spec(cfg: JobConfig, name: str, queue: str, priority: str) -> JobSpec:
    """A job config's demand: the training ranks as one gang under their placement strategy; the
    static rollout instances and verifier workers as a second gang (PACK); `rollout.elastic`
    instances as elastic parts."""
    t, r, v = cfg.trainer, cfg.rollout, cfg.verifier
    workers = [instance_bundle(r) for _ in range(r.instances)]
    workers += [worker_bundle(v) for _ in range(v.workers)]
    workers += [worker_bundle(v, gpu=True) for _ in range(v.gpu_workers)]
    gangs = (
        Gang(tuple(rank_bundle(t) for _ in range(t.ranks)), Strategy(t.placement_strategy.value)),
        Gang(tuple(workers), Strategy.PACK),
    )
    elastic = tuple(instance_bundle(r) for _ in range(r.elastic))
    return JobSpec(name, queue, priority, gangs, elastic, walltime_s=cfg.run.walltime_s)


def required_resources(cfg: JobConfig) -> dict[str, float]:
    """What the job holds at once: its gangs, as the cluster scheduler is asked for them (`job_spec`:
    ranks, static instances, CPU and GPU verifier workers, with their `resources`), and its transient
    instances, whose windows may overlap."""
    spec = job_spec(cfg, cfg.run.out_dir.name, "", "")
    transient = [instance_bundle(cfg.rollout) for _ in cfg.rollout.transient]
    return add(*(bundle for gang in spec.gangs for bundle in gang.bundles), *transient)


def embedded_resources(cfg: JobConfig) -> Bundle:
    """What the embedded local cluster started for `cfg` has (the resources a job asks for; Ray adds
    memory and a node's own names)."""
    return {"CPU": float(cfg.cluster.num_cpus), "GPU": float(cfg.cluster.num_gpus)}


def shortfall(cfg: JobConfig, have: Bundle) -> list[str]:
    """Each resource the job needs at once (`required_resources`) that `have` lacks, in words."""
    return [
        f"{k}: the job needs {v:g}, the cluster has {have.get(k, 0.0):g}"
        for k, v in required_resources(cfg).items()
        if v > have.get(k, 0.0)
    ]


def store_path(cfg: JobConfig, out_dir: Path | None) -> Path | None:
    """Where the partial-output store lives: store.path, else partial.sqlite in the run's directory."""
    if not cfg.store.enabled:
        return None
    return cfg.store.path or (out_dir or cfg.run.out_dir) / "partial.sqlite"


def fleet_params(cfg: JobConfig) -> fx.FleetParams:
    """The core's parameters from the job's config (transient windows named `transient-K`)."""
    r, w = cfg.rollout, cfg.weights
    windows = tuple(
        fx.Window(
            f"transient-{k}",
            t.join_iteration,
            t.join_at_s,
            t.available_s,
            t.reclaim_iteration,
            t.reclaim_at_s,
            t.leave,
            (t.receiver_gbps or w.receiver_gbps or 0.0) * 1e9,
        )
        for k, t in enumerate(r.transient)
    )
    cost = ResumeCost(r.prefill_tokens_per_s, r.decode_tokens_per_s, r.resume_setup_s)
    swap = swap_fallback(cfg) is None and r.inflight_update is InflightUpdate.SWAP
    return fx.FleetParams(
        r.request_batch, r.max_staleness, cost, windows, w.relay_params(), swap, r.refill, r.refill_min
    )


def swap_fallback(cfg: JobConfig) -> str | None:
    """Why the job's instances cannot take a version in flight, where it asked them to (they finish
    their running requests on the old version instead); None where they can, or it did not ask."""
    return swap_refusal(cfg.rollout.inflight_update, str(cfg.engine.kind))


def pool_params(cfg: VerifierConfig, retries: int, gpu: bool) -> vx.PoolParams:
    """The core's parameters from the job's `verifier` section."""
    return vx.PoolParams(
        VerifyParams(cfg.dispatch, preempt=cfg.preempt),
        workers=cfg.gpu_workers if gpu else cfg.workers,
        retries=retries,
        timeouts=cfg.timeout.params(),
        heartbeats=vx.Heartbeats(cfg.heartbeat_s, cfg.heartbeat_timeout_s),
        grace_s=cfg.timeout.grace_s,
        name="gpu-verifier" if gpu else "verifier",
    )


@dataclass(frozen=True)
class Retries:
    """The retry policies of the drivers' kinds of work (`rlsched.policy.retry`); the verifier pool's
    core and an episode's environments make theirs from `grpo.verify_retries` and `agent.env_retries`,
    which reach them as counts."""

    weight_pull: RetryPolicy
    evaluation: RetryPolicy
    recovery: RetryPolicy


def retries(cfg: JobConfig) -> Retries:
    return Retries(
        weight_pull=RetryPolicy(cfg.weights.pull_retries),
        evaluation=RetryPolicy(cfg.eval.retries),
        recovery=RetryPolicy(cfg.checkpoint.max_recoveries),
    )

"""The job controller: a job's actors (the training group, the rollout fleet, the verifier pools, the
OpenAI endpoint when it runs) and what the job's loop asks of them between iterations: run an
iteration, evaluate, save the policy, check the weights, restart a failed training group.

An iteration is the iteration core's (`rlsched.core.pipeline`, sync or async), carried out by its
one driver (`rlsched.job.iterations.IterationRun`, over this job's actors through ports) and a
producer of arrivals (`rlsched.job.arrivals`):
single-turn requests on the fleet's streams, or a multi-turn job's episodes
(`actors.agent_episodes`). In order, for each step:

1. a wave's requests go out (group_size samples per problem; under `distrs`, problems with the
   longest expected verification first) to READY instances at an admissible version, joiners
   included (`actors.fleet`);
2. every finished sample goes to verification (`rlsched.job.verification`) when the core says: at once,
   or, with `schedule.overlap: false`, once all exist (the sequential baseline);
3. the batch: group-relative advantages over fully judged groups at an allowed version;
4. `update`: the training group's GRPO step (all ranks, gradients all-reduced);
5. `publish`: rank 0's new BF16 version, held by its weight service;
6. `reload`: every serving instance pulls it over the weight link, loads it and confirms the
   checksum;
7. `commit`: the iteration record (`rlsched.job.records`), appended and fsync'ed by the caller.

The controller runs in the driver and holds only handles and bookkeeping; every span it records is
on its own clock (request sent -> sample arrived, dispatched -> outcome received).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray

from actors.agent_episodes import Episodes
from actors.cluster_client import ClusterClient
from actors.endpoint_link import EndpointLink
from actors.fleet import Fleet
from actors.orders import Orders
from actors.pool import VerifierPool
from actors.trainer import PublishedVersion, TrainingGroup
from actors.waits import step
from rlsched.config import JobConfig
from rlsched.config_params import retries, store_path
from rlsched.job.arrivals import Producer, Requests
from rlsched.job.durability import Start
from rlsched.job.iterations import IterationRun
from rlsched.job.ports import OnPrepared
from rlsched.job.records import IterationRecord
from rlsched.job.verification import JobVerification
from rlsched.metrics.spans import Span, SpanKind, set_aside
from rlsched.model.checkpoint import inspect_checkpoint, load_prompting, write_checkpoint
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.versions import PipelineMode
from rlsched.rl.agent import spec_of
from rlsched.rl.evaluate import EvalResult, eval_requests, score
from rlsched.rl.feed import ProblemFeed
from rlsched.rl.grpo import LossStats, importance
from rlsched.rl.pending import PendingWork
from rlsched.rl.requests import sampling_params
from rlsched.rl.task import TaskProblem
from rlsched.rl.tasks import build_task
from rlsched.transfer.client import WeightClient
from verifiers.loading import VerifierSet
from verifiers.protocol import Stage


class JobController:
    def __init__(
        self,
        cfg: JobConfig,
        log: Callable[[str], None] = print,
        out_dir: Path | None = None,
        inbox: Any = None,
        cluster: ClusterClient | None = None,
        groups: Sequence[Any] = (),
        start: Start | None = None,
    ) -> None:
        self.cfg, self.log, self.clock = cfg, log, time.monotonic
        self.spans: list[Span] = []
        self.redone_spans: list[Span] = []  # of iterations a recovery ran again (the timeline's)
        self.tokenizer, self.template = load_prompting(cfg.model.checkpoint, cfg.model.template)
        self.task = build_task(cfg.task)
        self.verifiers = VerifierSet(
            cfg.verifier.kind,
            cfg.verifier.sandbox.policy(),
            cfg.task.rewards(),
            cfg.verifier.timeout.params(),
        )
        resume_after = None if start is None else start.iteration  # a resumed run: its episodes come back
        start = start or Start()
        self.attempt = start.attempt
        self.feed = ProblemFeed(
            self.task, cfg.run.seed, start.cursor, start.pending.problems if start.pending else ()
        )
        self.sampling = sampling_params(cfg.sampling, self.template)
        checkpoint = str(cfg.model.checkpoint) if cfg.model.checkpoint else None
        # under the cluster scheduler: the training gang's and the workers' placement groups
        trainer_pg, workers_pg = (groups[0], groups[1]) if groups else (None, None)
        self._trainer_pg = trainer_pg
        # the ranks, the instances and the verifier workers start together; then the ranks are waited on
        starting = self._new_group()
        self.fleet = Fleet(cfg, checkpoint, store_path(cfg, out_dir), self.spans, self.clock, log)
        self.fleet.instances.pg = workers_pg
        for i in range(cfg.rollout.instances):
            self.fleet.add(f"rollout-{i}")
        self.orders = Orders(self.fleet, cluster, inbox, self.clock, log)
        self._workers_pg = workers_pg
        self.verification = JobVerification(cfg, self.verifiers, self._pool, self.clock)
        self.estimator = self.verification.estimator
        self.group = self._training_group(starting, start)
        self.fleet.publish(self.group.publish(start.version))
        self.fleet.reload()
        self.fleet.wait_serving()
        self.endpoint = (
            EndpointLink(cfg, self.fleet, self.verifiers, log, out_dir, resume_after)
            if cfg.rollout.endpoint.enabled
            else None
        )
        self.agent = (
            Episodes(
                cfg, self.feed, self.fleet, spec_of(cfg, self.sampling, _journal(out_dir)), log,
                fresh=resume_after is None,
            )
            if cfg.agent.enabled
            else None
        )  # fmt: skip
        self.consumed: list[tuple[str, str]] = []  # (request id, how) of the last iteration
        self.run = IterationRun(self, self._producer(), start.version, start.iteration, pending=start.pending)

    def _producer(self) -> Producer:
        """What makes this job's samples: a multi-turn job's episodes, or the fleet's requests (a new
        one for each run, so that samples of an abandoned run are told apart)."""
        if self.agent is not None:
            return self.agent
        prompting = (self.tokenizer, self.template)
        return Requests(self.cfg, self.feed, self.fleet, self.verification, prompting, self.sampling)

    # -- where the job starts, and where it starts again ----------------------------------------------

    def _pool(
        self, stage: Stage, estimator: RemainingTime, on_prepared: OnPrepared | None = None
    ) -> VerifierPool:
        """One stage of the job's verification: its workers in the scheduler's placement group."""
        v, rewards = self.cfg.verifier, self.verifiers.rewards
        return VerifierPool(
            v, self.cfg.grpo.verify_retries, estimator, self.spans, self.clock, self.log, stage=stage,
            on_prepared=on_prepared, pg=self._workers_pg, rewards=rewards,
        )  # fmt: skip

    def wait(self, others: Iterable[Any], on_ready: Callable[[Any], None], timeout_s: float) -> None:
        """The iteration driver's wait: one turn of `ray.wait` over the verifier pools and `others`."""
        step(self.verification.pools, others, on_ready, timeout_s=timeout_s)

    @property
    def cursor(self) -> int:
        """Training problems drawn so far (a checkpoint's data position)."""
        return self.feed.cursor

    def _new_group(self) -> TrainingGroup:
        """The training gang, starting (`_training_group` waits for it)."""
        cfg = self.cfg
        checkpoint = str(cfg.model.checkpoint) if cfg.model.checkpoint else None
        return TrainingGroup(cfg.trainer, cfg.grpo, cfg.weights, checkpoint, cfg.run.seed, self._trainer_pg)

    def _training_group(self, group: TrainingGroup, start: Start) -> TrainingGroup:
        """`group` once its ranks have met, with `start`'s training state loaded."""
        group.ready()
        if start.state is not None:
            steps = group.load_state(start.state)
            self.log(
                f"training state of iteration {start.iteration} loaded from {start.state} (step {steps})"
            )
        return group

    def restart_training(self, start: Start) -> int:
        """The training group failed: a new one from `start`'s training state, the data rewound to its
        cursor, and its weights published to the fleet under a new version number (a number names
        one set of weights, so the fleet never sees one reused). Returns that version. The waves in
        flight are abandoned: their samples are ignored."""
        self.group.shutdown()
        self.redone_spans += set_aside(self.spans, start.iteration)  # shared: changed in place
        self.group = self._training_group(self._new_group(), start)
        self.feed.rewind(start.cursor, start.pending.problems if start.pending else ())
        version = self.version + 1
        restarts = self.run.restarts + 1
        self.run = IterationRun(self, self._producer(), version, start.iteration, restarts, start.pending)
        self.reload(self.group.publish(version), replenish=True)
        if self.endpoint is not None:
            self.endpoint.restore(start.iteration)
        return version

    def episodes_checkpointed(self, iteration: int) -> None:
        """Every checkpoint kept holds the iterations up to `iteration`: the endpoint's journal lets
        go of the episodes they took."""
        if self.endpoint is not None:
            self.endpoint.checkpointed(iteration)

    # -- the iterations --------------------------------------------------------------------------

    def record(self) -> None:
        """Keep every event the iteration's core is fed and its effects from now on (`run.trace`:
        the trace-equivalence test's record)."""
        self.run.record()

    @property
    def version(self) -> int:
        """The newest published version: what the instances hold."""
        return self.run.core.version

    def stop_training(self, iteration: int) -> bool:
        """The job means to stop before `iteration`: no more updates start. Whether the ranks have
        already stepped on `iteration` (which must then be committed too; only a pipelined job's can)."""
        self.run.stopping = True
        return self.run.step_started(iteration)

    @property
    def training_ahead(self) -> bool:
        """A pipelined job's ranks hold (or are computing) a step past the last committed one."""
        return self.run.training_ahead

    def pending_work(self) -> PendingWork | None:
        """What a pipelined job holds beyond its last committed step (None in `sync` mode)."""
        if self.cfg.schedule.mode is PipelineMode.SYNC or not isinstance(self.run.producer, Requests):
            return None
        return self.run.pending_work(self.run.producer.position_of)

    def run_iteration(self, iteration: int) -> IterationRecord:
        """Iteration `iteration`, until the core commits it; its spans are recorded as it goes. A
        pipelined job's (`schedule.mode: async`) next ones go on meanwhile."""
        rec = self.run.run_until(iteration)
        self.consumed = self.run.consumed.pop(iteration)
        return rec

    def publish(self, iteration: int, version: int) -> PublishedVersion:
        start = self.clock()
        meta = self.group.publish(version)
        attrs = {"lane": "trainer", "bytes": meta.nbytes, "checksum": meta.checksum[:16]}
        self.spans.append(Span(SpanKind.PUBLISH, f"v{meta.version}", start, self.clock(), iteration, attrs))
        return meta

    def reload(self, meta: PublishedVersion, replenish: bool = False) -> None:
        """Every serving instance takes `meta`'s version, blocking (a restarted training group's). With
        `replenish`, instances the job lost without a replacement (their reload died with an old
        training group's weight service) are replaced first, and join at this version."""
        self.fleet.publish(meta)
        if replenish:
            self.fleet.replenish(self.cfg.rollout.instances)
        failed = self.fleet.counts.join_failures
        self.fleet.reload(self.held(meta.version))
        self.reload_ended(failed, meta.version)

    def held(self, version: int) -> list[str]:
        """Instances a reload to `version` leaves in place (the endpoint's pinned episodes)."""
        return self.endpoint.held(version) if self.endpoint is not None else []

    def reload_ended(self, failures_before: int, version: int) -> None:
        """Every instance has `version`: a join that failed meanwhile may mean rank 0's weight service
        is gone (the training group is checked), and the endpoint learns the fleet and the version."""
        if self.fleet.counts.join_failures > failures_before:
            self.group.check("reload")
        if self.endpoint is not None:
            self.endpoint.reloaded(version)

    def record_extra(self, stats: LossStats) -> dict[str, Any]:
        """What every iteration's record adds, in either mode: the pool's and the fleet's counts since
        the job started, the instances serving, and the update's importance weights."""
        return {
            "verifier_pool": asdict(self.verification.pool.counts),
            "fleet": asdict(self.fleet.counts),
            "serving": sorted(self.fleet.serving()),
            "importance": importance(stats, self.cfg.grpo),
            "skipped_steps": stats.skipped,
        }

    # -- evaluation, the trained policy and shutdown ----------------------------------------------

    def evaluate(self, problems: tuple[TaskProblem, ...] | list[TaskProblem]) -> EvalResult:
        """`rlsched.rl.evaluate`'s requests, spread over the serving instances, scored alike (a
        multi-turn job's: greedy episodes)."""
        if self.agent is not None:
            return self.agent.evaluate(problems, self.sampling, self.verifiers)
        requests = eval_requests(
            self.tokenizer, self.template, problems, max_tokens=self.cfg.sampling.max_tokens
        )
        retry, failures = retries(self.cfg).evaluation, 0
        while True:  # an instance that dies meanwhile is replaced, and the evaluation rerun
            if not self.fleet.serving():
                self.fleet.wait_serving()
            names = self.fleet.serving()
            refs = [
                self.fleet.handles[n].complete.remote(requests[i :: len(names)]) for i, n in enumerate(names)
            ]
            batches, dead = [], []
            for name, ref in zip(names, refs, strict=True):
                try:
                    batches.append(ray.get(ref))
                except ray.exceptions.RayActorError:
                    dead.append(name)
            if not dead:
                return score(problems, (s for batch in batches for s in batch), self.verifiers)
            for name in dead:
                self.fleet.died(name)
            failures += 1
            if retry.gives_up(failures):
                raise RuntimeError(
                    f"the held-out evaluation lost an instance {failures} times in a row (eval.retries)"
                )

    def save_policy(self, out: Path) -> Path:
        """The latest published version as a checkpoint directory (`rlsched generate --checkpoint`),
        pulled from the weight service like any instance would."""
        latest = self.fleet.latest
        assert latest is not None
        with WeightClient(latest.address) as client:
            pulled = client.pull(latest.version, receiver="driver")
        source = inspect_checkpoint(self.cfg.model.checkpoint).path
        return write_checkpoint(source, bytes(pulled.blob), out, self.cfg.model.template)

    def weights_check(self) -> dict[str, Any]:
        """Whether every rank holds the latest published weights (its SHA-256 of the BF16 bytes) and
        every serving instance holds that version (each confirmed the same checksum when it loaded)."""
        latest = self.fleet.latest
        assert latest is not None
        versions = self.fleet.serving_versions()
        return {
            "version": latest.version,
            "sha256": latest.checksum,
            "ranks_agree": all(s == latest.checksum for s in self.group.checksums()),
            "instances": versions,
            "instances_at_latest": all(v == latest.version for v in versions.values()),
        }

    def shutdown(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
        self.fleet.shutdown()
        self.verification.shutdown()
        self.group.shutdown()
        if self.agent is not None:
            self.agent.close()


def _journal(out_dir: Path | None) -> Path | None:
    """A multi-turn job's rounds journal: the run's `rounds.sqlite`."""
    return out_dir / "rounds.sqlite" if out_dir is not None else None

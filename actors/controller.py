"""The job controller: one RL iteration as numbered phases over the Ray actors.

1. `request_samples`      - group_size samples per prompt, queued for the rollout fleet
                            (`actors.fleet`: READY instances at an admissible version take batches
                            as they free up, joiners included; under `distrs`, problems with the
                            longest expected verification first);
2. `generate_and_verify`  - every finished sample is handed to the verifier pool (`actors.pool`)
                            the moment it arrives, dispatched by `rlsched.policy.verify.decide` and
                            verified while generation goes on; `schedule.overlap: false` waits for
                            all samples first (the sequential baseline);
3. `assemble`             - group-relative advantages over fully judged groups at an allowed version;
4. `update`               - the training group's GRPO step (all ranks, gradients all-reduced);
5. `publish`              - rank 0's new BF16 version, held by its weight service;
6. `reload`               - every serving instance pulls it over the weight link, loads it and
                            confirms the checksum;
7. `commit`               - the iteration record appended to metrics.jsonl and fsync'ed.

The controller runs in the driver and holds only handles and bookkeeping; every span it records is
on its own clock (request sent -> sample arrived, dispatched -> outcome received).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray

from actors.cluster import ClusterClient, JobStopped
from actors.fleet import Fleet
from actors.interrupt import ctrl_c
from actors.pool import VerifierPool, step
from actors.trainer import PublishedVersion, TrainingGroup
from rlsched.config import JobConfig
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample
from rlsched.metrics.spans import Span, SpanKind
from rlsched.model.checkpoint import inspect_checkpoint, load_prompting, write_checkpoint
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import (
    BatchId,
    BatchState,
    DispatchPolicy,
    PendingVerification,
    TaskId,
    generation_order,
)
from rlsched.policy.versions import oldest_admissible
from rlsched.rl.assemble import assemble
from rlsched.rl.evaluate import EvalResult, eval_requests, score
from rlsched.rl.requests import group_requests, run_seed_for_requests, sampling_params
from rlsched.rl.task import TaskProblem, build_task, verify_kind_key
from rlsched.rl.update import TrainItem
from rlsched.transfer.client import WeightClient
from verifiers.loading import VerifierSet, VerifierSpecError
from verifiers.protocol import ExecutionFault, Outcome, Prepared, Verdict, VerifyRequest


@dataclass
class IterationRecord:
    iteration: int
    version: int  # the weight version the samples were generated with
    samples: int
    used: int  # samples that went into the update
    stale_dropped: int
    faults: int
    reward_mean: float
    pass_rate: float
    tokens: int
    loss: float
    eval_pass_rate: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def store_path(cfg: JobConfig, out_dir: Path | None) -> Path | None:
    """Where the partial-output store lives: store.path, else partial.sqlite in the run's directory."""
    if not cfg.store.enabled:
        return None
    return cfg.store.path or (out_dir or cfg.run.out_dir) / "partial.sqlite"


class JobController:
    def __init__(
        self,
        cfg: JobConfig,
        log: Callable[[str], None] = print,
        out_dir: Path | None = None,
        inbox: Any = None,
        cluster: ClusterClient | None = None,
        groups: Sequence[Any] = (),
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.clock = time.monotonic
        self.spans: list[Span] = []
        self.tokenizer, self.template = load_prompting(cfg.model.checkpoint, cfg.model.template)
        self.task = build_task(cfg.task)
        # for evaluation in the driver
        self.verifiers = VerifierSet(cfg.verifier.kind, cfg.verifier.sandbox.policy())
        self.train_stream: Iterator[TaskProblem] = self.task.train_problems(random.Random(cfg.run.seed))
        self.sampling = sampling_params(cfg.sampling, self.template)
        checkpoint = str(cfg.model.checkpoint) if cfg.model.checkpoint else None
        # under the cluster scheduler: the training gang's and the workers' placement groups
        trainer_pg, workers_pg = (groups[0], groups[1]) if groups else (None, None)
        self.cluster = cluster
        self.group = TrainingGroup(cfg.trainer, cfg.grpo, cfg.weights, checkpoint, cfg.run.seed, trainer_pg)
        self.fleet = Fleet(cfg, checkpoint, store_path(cfg, out_dir), self.spans, self.clock, log)
        self.fleet.pg = workers_pg
        for i in range(cfg.rollout.instances):
            self.fleet.add(f"rollout-{i}")
        self.version = 0
        self._held: list[tuple[PendingVerification, VerifyRequest, str | None, int, bytes]] = []
        self.inbox = inbox  # `rlsched scale` commands arrive here (actors.scale)
        self._polled = 0.0
        self.estimator = RemainingTime()  # verification times per problem, learnt as outcomes arrive
        v, retries = cfg.verifier, cfg.grpo.verify_retries
        self.gpu_pool: VerifierPool | None = None
        if v.gpu_workers:  # two-stage verifiers: compile on the CPU pool, run on a GPU worker
            self.gpu_pool = VerifierPool(
                v, retries, RemainingTime(), self.spans, self.clock, log, stage="gpu", pg=workers_pg
            )
        self.pool = VerifierPool(
            v,
            retries,
            self.estimator,
            self.spans,
            self.clock,
            log,
            stage="whole" if self.gpu_pool is None else "cpu",
            on_prepared=None if self.gpu_pool is None else self._to_gpu_stage,
            pg=workers_pg,
        )
        self.fleet.publish(self.group.publish(0))
        self.fleet.reload()
        self.fleet.wait_serving()

    # -- phases ----------------------------------------------------------------------------------

    def request_samples(self, iteration: int) -> tuple[list[GenerationRequest], dict[RequestId, TaskProblem]]:
        problems = [next(self.train_stream) for _ in range(self.cfg.grpo.prompts_per_step)]
        v = self.cfg.verifier
        if v.dispatch is DispatchPolicy.DISTRS and v.order_generation:  # longest verification first
            stages = [self.estimator] + ([self.gpu_pool.estimator] if self.gpu_pool else [])
            order = generation_order([self._kind_key(p) for p in problems], stages)
            problems = [problems[i] for i in order]
        return group_requests(
            problems,
            self.cfg.grpo.group_size,
            str(iteration),
            self.tokenizer,
            self.template,
            self.sampling,
            run_seed_for_requests(self.cfg),
        )

    def generate_and_verify(
        self, iteration: int, requests: list[GenerationRequest], references: dict[RequestId, TaskProblem]
    ) -> tuple[dict[RequestId, Sample], dict[RequestId, Outcome]]:
        start = self.clock()
        fleet = self.fleet
        fleet.begin(iteration, requests)
        samples: dict[RequestId, Sample] = {}
        pools = [p for p in (self.pool, self.gpu_pool) if p is not None]
        warned = False
        while fleet.generating or self._held or not all(p.idle for p in pools):
            ctrl_c.check()  # a Ctrl-C swallowed where it landed stops the job here
            self._poll_inbox()
            fleet.tick()
            if self._held and not fleet.generating:  # the sequential baseline: the whole batch at once
                self.pool.submit_many(self._held)
                self._held = []
            batch = BatchState(
                BatchId(f"iter-{iteration}"),
                cost_rate=float(self.cfg.trainer.ranks * max(1, self.cfg.trainer.gpus_per_rank)),
                outstanding=len(requests) - len(samples),
            )
            for pool in pools:
                pool.dispatch((batch,))
            wait_s = min(0.5, fleet.next_event_in() or 0.5)
            others = fleet.waitables()
            warned = self._stranded(iteration, warned)
            if not others and all(p.idle for p in pools):
                time.sleep(min(wait_s, 0.05))  # only a transient window to wait for
                continue
            step(
                pools,
                others,
                lambda ref: self._on_samples(iteration, fleet.on_ready(ref), start, samples, references),
                timeout_s=wait_s,
            )
        outcomes = {RequestId(t): o for p in pools for t, o in p.take_outcomes().items()}
        return samples, outcomes

    def _stranded(self, iteration: int, warned: bool) -> bool:
        """Requests wait and no instance serves or joins: fail, or (with `rlsched scale` at hand) say
        so once and wait for instances to be added. Returns whether it has said so."""
        if not self.fleet.stranded():
            return warned
        stranded = (
            f"iteration {iteration}: {len(self.fleet.core.pending)} request(s) wait but no rollout instance "
            "serves or is joining (the log says why they left)"
        )
        if self.inbox is None:
            raise RuntimeError(stranded)
        if not warned:
            self.log(stranded + "; waiting for `rlsched scale JOB --add N`")
        return True

    def _poll_inbox(self, every_s: float = 1.0) -> None:
        if self.clock() - self._polled < every_s:
            return
        self._polled = self.clock()
        self.follow_scheduler()
        if self.inbox is None:
            return
        for command in ray.get(self.inbox.take.remote()):
            self.fleet.scale(command)
        self.inbox.report.remote(self.fleet.snapshot())

    def follow_scheduler(self) -> None:
        """The cluster scheduler's orders: start the elastic instances it granted, give back those it
        reclaims (preempted: their requests resume elsewhere from saved tokens), stop if told to."""
        if self.cluster is None:
            return
        view = self.cluster.poll()
        if view["cancel"]:
            raise JobStopped("cancelled with `rlsched cancel`", preempted=False)
        if view["stop_in"] is not None:
            raise JobStopped(f"preempted by the cluster scheduler ({view['why']})", preempted=True)
        for part in view["release"]:
            self.fleet.reclaim(part, f"the cluster scheduler reclaims it {view['why']}")
            self.cluster.released(part)
        for part, pg in view["parts"].items():
            self.fleet.grant(part, pg)

    def _to_gpu_stage(
        self,
        task: PendingVerification,
        request: VerifyRequest,
        kind: str | None,
        iteration: int,
        prepared: Prepared,
    ) -> None:
        assert self.gpu_pool is not None
        self.gpu_pool.submit(task, request, kind, iteration, prepared.payload)

    def _on_samples(
        self,
        iteration: int,
        arrived: list[tuple[str, Sample]],
        start: float,
        samples: dict[RequestId, Sample],
        references: dict[RequestId, TaskProblem],
    ) -> None:
        for lane, sample in arrived:
            self._on_sample(iteration, lane, sample, start, samples, references)

    def _on_sample(
        self,
        iteration: int,
        lane: str,
        sample: Sample,
        start: float,
        samples: dict[RequestId, Sample],
        references: dict[RequestId, TaskProblem],
    ) -> None:
        now = self.clock()
        samples[sample.request_id] = sample
        self.spans.append(
            Span(
                SpanKind.GENERATE,
                sample.request_id,
                start,
                now,
                iteration,
                {
                    "lane": lane,
                    "tokens": sample.num_tokens,
                    "version": int(sample.weight_version),
                    "resumed_tokens": sample.resumed_tokens,
                },
            )
        )
        problem = references[sample.request_id]
        kind, key = self._kind_key(problem)
        task = PendingVerification(
            TaskId(sample.request_id),
            BatchId(f"iter-{iteration}"),
            now,
            kind=kind,
            key=key,
            slots=self._slots(problem.verifier),
        )
        request = VerifyRequest(sample.request_id, sample.text, problem.answer)
        if self.cfg.schedule.overlap:
            self.pool.submit(task, request, problem.verifier, iteration)
        else:  # handed over once every sample exists
            self._held.append((task, request, problem.verifier, iteration, b""))

    def _slots(self, kind: str | None) -> int:
        """Workers one verification of this kind needs at once (a verifier's `slots`, default 1);
        a kind that does not load needs one, and its worker reports the INPUT fault."""
        try:
            return max(1, int(getattr(self.verifiers.get(kind), "slots", 1)))
        except VerifierSpecError:
            return 1

    def _kind_key(self, problem: TaskProblem) -> tuple[str, str]:
        return verify_kind_key(problem, self.cfg.verifier.kind)

    def assemble(
        self,
        requests: list[GenerationRequest],
        samples: dict[RequestId, Sample],
        outcomes: dict[RequestId, Outcome],
    ) -> tuple[list[TrainItem], dict[str, int]]:
        """Fully judged groups whose samples all come from an allowed version (`rlsched.rl.assemble`)."""
        oldest = oldest_admissible(self.version, self.cfg.rollout.max_staleness)
        ids = [r.request_id for r in requests]
        batch = assemble(ids, samples, outcomes, self.cfg.grpo.group_size, oldest)
        return batch.items, {"faults": batch.faults, "stale_dropped": batch.stale_dropped}

    def update(self, iteration: int, items: list[TrainItem]) -> float:
        stats, start, end = self.group.update(items)
        self.spans.append(
            Span(
                SpanKind.UPDATE,
                f"update-{iteration}",
                start,
                end,
                iteration,
                {"lane": "trainer", "samples": len(items)},
            )
        )
        return stats.loss

    def publish(self, iteration: int) -> PublishedVersion:
        start = self.clock()
        meta = self.group.publish(self.version + 1)
        self.spans.append(
            Span(
                SpanKind.PUBLISH,
                f"v{meta.version}",
                start,
                self.clock(),
                iteration,
                {"lane": "trainer", "bytes": meta.nbytes, "checksum": meta.checksum[:16]},
            )
        )
        return meta

    def reload(self, meta: PublishedVersion) -> None:
        self.fleet.publish(meta)
        self.fleet.reload()
        self.version = meta.version

    def save_policy(self, out: Path) -> Path:
        """The latest published version as a checkpoint directory (`rlsched generate --checkpoint`),
        pulled from the weight service like any instance would."""
        latest = self.fleet.latest
        assert latest is not None
        with WeightClient(latest.address) as client:
            pulled = client.pull(latest.version, receiver="driver")
        source = inspect_checkpoint(self.cfg.model.checkpoint).path
        return write_checkpoint(source, bytes(pulled.blob), out, self.cfg.model.template)

    def run_iteration(self, iteration: int) -> IterationRecord:
        """One iteration, phase by phase; its spans are recorded as it goes."""
        start = self.clock()
        requests, references = self.request_samples(iteration)  # 1
        samples, outcomes = self.generate_and_verify(iteration, requests, references)  # 2
        items, counts = self.assemble(requests, samples, outcomes)  # 3
        version = self.version
        loss = self.update(iteration, items)  # 4
        meta = self.publish(iteration)  # 5
        self.reload(meta)  # 6
        self.spans.append(
            Span(
                SpanKind.ITERATION,
                f"iter-{iteration}",
                start,
                self.clock(),
                iteration,
                {"lane": "controller"},
            )
        )
        verdicts = [o for o in outcomes.values() if isinstance(o, Verdict)]
        unjudgeable = [o for o in outcomes.values() if isinstance(o, ExecutionFault) and not o.kind.retryable]
        if unjudgeable:
            first = unjudgeable[0].detail
            self.log(f"iteration {iteration}: {len(unjudgeable)} sample(s) cannot be judged, e.g. {first}")
        return IterationRecord(  # 7: the caller commits it
            iteration=iteration,
            version=version,
            samples=len(samples),
            used=len(items),
            stale_dropped=counts["stale_dropped"],
            faults=counts["faults"],
            reward_mean=sum(v.reward for v in verdicts) / max(len(verdicts), 1),
            pass_rate=sum(v.correct for v in verdicts) / max(len(verdicts), 1),
            tokens=sum(s.num_tokens for s in samples.values()),
            loss=loss,
            extra={
                "sample_versions": sorted({int(s.weight_version) for s in samples.values()}),
                "verifier_pool": asdict(self.pool.counts),  # since the job started
                "fleet": asdict(self.fleet.counts),  # since the job started
                "serving": sorted(self.fleet.serving()),
            },
        )

    # -- evaluation and shutdown -----------------------------------------------------------------

    def evaluate(self, problems: tuple[TaskProblem, ...] | list[TaskProblem]) -> EvalResult:
        """`rlsched.rl.evaluate`'s requests, spread over the serving instances, scored alike."""
        requests = eval_requests(
            self.tokenizer, self.template, problems, max_tokens=self.cfg.sampling.max_tokens
        )
        handles = self.fleet.serving_handles()
        refs = [h.complete.remote(requests[i :: len(handles)]) for i, h in enumerate(handles)]
        return score(problems, (s for batch in ray.get(refs) for s in batch), self.verifiers)

    def shutdown(self) -> None:
        self.fleet.shutdown()
        self.pool.shutdown()
        if self.gpu_pool is not None:
            self.gpu_pool.shutdown()
        self.group.shutdown()


def run_silently(cfg: JobConfig, iterations: int) -> JobController:
    """A job for benchmarks and validation: `iterations` iterations without output, its actors
    released afterwards; the controller's spans and estimator stay readable."""
    controller = JobController(cfg, log=lambda _: None)
    try:
        for it in range(1, iterations + 1):
            controller.run_iteration(it)
    finally:
        controller.shutdown()
    return controller


def commit_record(path: Path, line: str) -> None:
    """Append one record and fsync before the next iteration counts (the iteration is the unit of commit)."""
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())

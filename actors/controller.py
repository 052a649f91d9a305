"""The job controller: one RL iteration as numbered phases over the Ray actors.

1. `request_samples`      - group_size samples per prompt, spread over the READY instances (under
                            `distrs`, problems with the longest expected verification first);
2. `generate_and_verify`  - every finished sample is handed to the verifier pool (`actors.pool`)
                            the moment it arrives, dispatched by `rlsched.policy.verify.decide` and
                            verified while generation goes on; `schedule.overlap: false` waits for
                            all samples first (the sequential baseline);
3. `assemble`             - group-relative advantages over fully judged groups at an allowed version;
4. `update`               - the training group's GRPO step (all ranks, gradients all-reduced);
5. `publish`              - rank 0's new BF16 version into the object store;
6. `reload`               - every instance loads it and confirms the checksum;
7. `commit`               - the iteration record appended to metrics.jsonl and fsync'ed.

The controller runs in the driver and holds only handles and bookkeeping; every span it records is
on its own clock (request sent -> sample arrived, dispatched -> outcome received).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch

from actors.pool import VerifierPool, step
from actors.rollout import RolloutInstance
from actors.trainer import TrainingGroup
from rlsched.config import JobConfig
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, SamplingParams
from rlsched.metrics.spans import Span, SpanKind
from rlsched.model.checkpoint import load_checkpoint, load_state_bytes, save_checkpoint
from rlsched.model.template import load_template
from rlsched.policy.estimate import RemainingTime
from rlsched.policy.verify import (
    BatchId,
    BatchState,
    DispatchPolicy,
    PendingVerification,
    TaskId,
    generation_order,
)
from rlsched.rl.evaluate import EvalResult
from rlsched.rl.grpo import group_advantages
from rlsched.rl.requests import group_requests, sampling_params
from rlsched.rl.task import JsonlProblem, TaskProblem, build_task
from rlsched.rl.update import TrainItem
from verifiers.loading import VerifierSet, VerifierSpecError
from verifiers.protocol import ExecutionFault, Outcome, Prepared, Verdict, VerifyRequest, run_verifier


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


class JobController:
    def __init__(self, cfg: JobConfig, log: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.log = log
        self.clock = time.monotonic
        self.spans: list[Span] = []
        ckpt = load_checkpoint(cfg.model.checkpoint)
        self.tokenizer = ckpt.tokenizer
        self.template = load_template(cfg.model.template) if cfg.model.template else ckpt.template
        self.task = build_task(cfg.task)
        self.verifiers = VerifierSet(cfg.verifier.kind)  # for evaluation in the driver
        self.train_stream: Iterator[TaskProblem] = self.task.train_problems(random.Random(cfg.run.seed))
        self.sampling = sampling_params(cfg.sampling, self.template)
        checkpoint = str(cfg.model.checkpoint) if cfg.model.checkpoint else None
        self.group = TrainingGroup(cfg.trainer, cfg.grpo, checkpoint, cfg.run.seed)
        self.instances = {
            f"rollout-{i}": RolloutInstance.options(num_cpus=cfg.rollout.cpus_per_instance).remote(
                f"rollout-{i}", checkpoint, cfg.engine.max_batch, cfg.engine.use_cache, cfg.run.seed + i
            )
            for i in range(cfg.rollout.instances)
        }
        self.version = 0
        self.estimator = RemainingTime()  # verification times per problem, learnt as outcomes arrive
        v, retries = cfg.verifier, cfg.grpo.verify_retries
        self.gpu_pool: VerifierPool | None = None
        if v.gpu_workers:  # two-stage verifiers: compile on the CPU pool, run on a GPU worker
            self.gpu_pool = VerifierPool(
                v, retries, RemainingTime(), self.spans, self.clock, log, stage="gpu"
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
        )
        self.reload(*self.group.publish(0), iteration=0)

    # -- phases ----------------------------------------------------------------------------------

    def request_samples(self, iteration: int) -> tuple[list[GenerationRequest], dict[RequestId, TaskProblem]]:
        problems = [next(self.train_stream) for _ in range(self.cfg.grpo.prompts_per_step)]
        v = self.cfg.verifier
        if v.dispatch is DispatchPolicy.DISTRS and v.order_generation:  # longest verification first
            stages = [self.estimator] + ([self.gpu_pool.estimator] if self.gpu_pool else [])
            order = generation_order([self._kind_key(p) for p in problems], stages)
            problems = [problems[i] for i in order]
        return group_requests(
            problems, self.cfg.grpo.group_size, str(iteration), self.tokenizer, self.template, self.sampling
        )

    def generate_and_verify(
        self, iteration: int, requests: list[GenerationRequest], references: dict[RequestId, TaskProblem]
    ) -> tuple[dict[RequestId, Sample], dict[RequestId, Outcome]]:
        start = self.clock()
        names = list(self.instances)
        chunks = {n: requests[i :: len(names)] for i, n in enumerate(names)}
        streams = {
            self.instances[n].generate.options(num_returns="streaming").remote(chunk): n
            for n, chunk in chunks.items()
            if chunk
        }
        samples: dict[RequestId, Sample] = {}
        pools = [p for p in (self.pool, self.gpu_pool) if p is not None]
        while streams or not all(p.idle for p in pools):
            if self.cfg.schedule.overlap or not streams:
                batch = BatchState(
                    BatchId(f"iter-{iteration}"),
                    cost_rate=float(self.cfg.trainer.ranks * max(1, self.cfg.trainer.gpus_per_rank)),
                    outstanding=len(requests) - len(samples),
                )
                for pool in pools:
                    pool.dispatch((batch,))
            step(
                pools,
                list(streams),
                lambda ref: self._on_sample(iteration, ref, streams, start, samples, references),
            )
        outcomes = {RequestId(t): o for p in pools for t, o in p.take_outcomes().items()}
        return samples, outcomes

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

    def _on_sample(
        self,
        iteration: int,
        stream: Any,
        streams: dict[Any, str],
        start: float,
        samples: dict[RequestId, Sample],
        references: dict[RequestId, TaskProblem],
    ) -> None:
        try:
            sample: Sample = ray.get(next(stream))
        except StopIteration:
            del streams[stream]
            return
        now = self.clock()
        samples[sample.request_id] = sample
        self.spans.append(
            Span(
                SpanKind.GENERATE,
                sample.request_id,
                start,
                now,
                iteration,
                {"lane": streams[stream], "tokens": sample.num_tokens, "version": int(sample.weight_version)},
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
        self.pool.submit(task, request, problem.verifier, iteration)

    def _slots(self, kind: str | None) -> int:
        """Workers one verification of this kind needs at once (a verifier's `slots`, default 1);
        a kind that does not load needs one, and its worker reports the INPUT fault."""
        try:
            return max(1, int(getattr(self.verifiers.get(kind), "slots", 1)))
        except VerifierSpecError:
            return 1

    def _kind_key(self, problem: TaskProblem) -> tuple[str, str]:
        """The verifier kind and the key whose history predicts a problem's verification time."""
        if isinstance(problem, JsonlProblem):
            return problem.verifier or self.cfg.verifier.kind, problem.id
        return self.cfg.verifier.kind, problem.content

    def assemble(
        self,
        requests: list[GenerationRequest],
        samples: dict[RequestId, Sample],
        outcomes: dict[RequestId, Outcome],
    ) -> tuple[list[TrainItem], dict[str, int]]:
        """Fully judged groups whose samples all come from an allowed version; advantages per group."""
        g = self.cfg.grpo.group_size
        oldest = self.version - self.cfg.rollout.max_staleness
        items: list[TrainItem] = []
        counts = {"faults": 0, "stale_dropped": 0}
        for start in range(0, len(requests), g):
            group = [r.request_id for r in requests[start : start + g]]
            judged = [outcomes.get(r) for r in group]
            if not all(isinstance(o, Verdict) for o in judged):
                counts["faults"] += sum(isinstance(o, ExecutionFault) for o in judged)
                continue
            if any(samples[r].weight_version < oldest for r in group):
                counts["stale_dropped"] += len(group)
                continue
            rewards = [o.reward for o in judged if isinstance(o, Verdict)]
            adv = group_advantages(torch.tensor([rewards]))[0].tolist()
            items.extend(
                TrainItem(samples[r].prompt_ids, samples[r].token_ids, samples[r].logprobs, a)
                for r, a in zip(group, adv, strict=True)
            )
        return items, counts

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

    def publish(self, iteration: int) -> tuple[Any, Any]:
        start = self.clock()
        blob_ref, meta = self.group.publish(self.version + 1)
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
        return blob_ref, meta

    def reload(self, blob_ref: Any, meta: Any, iteration: int) -> None:
        results = ray.get(
            [inst.load.remote(blob_ref, meta.version, meta.checksum) for inst in self.instances.values()]
        )
        for name, (_state, start, end) in zip(self.instances, results, strict=True):
            self.spans.append(
                Span(
                    SpanKind.LOAD,
                    f"{name}-v{meta.version}",
                    start,
                    end,
                    iteration,
                    {"lane": name, "version": meta.version},
                )
            )
        self.version = meta.version
        self._latest = blob_ref

    def save_policy(self, out: Path) -> Path:
        """The latest published version as a checkpoint directory (`rlsched generate --checkpoint`)."""
        ckpt = load_checkpoint(self.cfg.model.checkpoint)
        load_state_bytes(ckpt.model, ray.get(self._latest))
        return save_checkpoint(ckpt.model, self.tokenizer, self.template, out)

    def run_iteration(self, iteration: int) -> IterationRecord:
        """One iteration, phase by phase; its spans are recorded as it goes."""
        start = self.clock()
        requests, references = self.request_samples(iteration)  # 1
        samples, outcomes = self.generate_and_verify(iteration, requests, references)  # 2
        items, counts = self.assemble(requests, samples, outcomes)  # 3
        version = self.version
        loss = self.update(iteration, items)  # 4
        blob_ref, meta = self.publish(iteration)  # 5
        self.reload(blob_ref, meta, iteration)  # 6
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
            },
        )

    # -- evaluation and shutdown -----------------------------------------------------------------

    def evaluate(self, problems: tuple[TaskProblem, ...] | list[TaskProblem]) -> EvalResult:
        params = SamplingParams(
            temperature=0.0,
            max_tokens=self.cfg.sampling.max_tokens,
            stop_token_ids=self.template.stop_token_ids,
        )
        prompts = self.tokenizer.encode_batch([p.prompt(self.template) for p in problems])
        requests = [GenerationRequest(RequestId(str(i)), tuple(ids), params) for i, ids in enumerate(prompts)]
        names = list(self.instances)
        refs = [self.instances[n].complete.remote(requests[i :: len(names)]) for i, n in enumerate(names)]
        correct: dict[int, bool] = {}
        for batch in ray.get(refs):
            for s in batch:
                i = int(s.request_id)
                out = run_verifier(
                    self.verifiers.get(problems[i].verifier),
                    VerifyRequest(s.request_id, s.text, problems[i].answer),
                )
                correct[i] = isinstance(out, Verdict) and out.correct
        carry = [i for i, p in enumerate(problems) if p.has_carry()]
        return EvalResult(
            sum(correct.values()) / len(problems),
            sum(correct.values()),
            len(problems),
            sum(correct[i] for i in carry) / max(len(carry), 1),
        )

    def shutdown(self) -> None:
        for handle in self.instances.values():
            ray.kill(handle)
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

"""The single-process GRPO loop: generate, verify, update, publish, as numbered phases.

This is what `rlsched run` drives until the Ray job exists, and what the Ray actors will wrap: the
rollout engine holds its own copy of the weights and receives each new version as BF16 safetensors
bytes, exactly as a remote instance will. Each iteration:

1. `group_requests`   - `group_size` samples for each of `prompts_per_step` training prompts;
2. `verify`           - each sample judged as it arrives; execution faults retried, never scored 0;
3. `assemble`         - group-relative advantages over the judged samples;
4. `update`           - one clipped policy-gradient step on the fp32 master weights;
5. `publish`          - BF16 bytes of the new weights loaded into the engine as the next version.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlsched.config import JobConfig
from rlsched.config_agent import PREFIX_CACHE_BLOCKS
from rlsched.config_params import pipeline_params, run_rules
from rlsched.core import iteration as it
from rlsched.core.pipeline import PipelineCore
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, WeightVersion
from rlsched.engine.torch_engine import TorchRolloutEngine, engine_dtype
from rlsched.model.checkpoint import Checkpoint, checksum, load_checkpoint, to_bf16_bytes, write_checkpoint
from rlsched.policy.verify import BatchId, PendingVerification, TaskId
from rlsched.rl import agent as ag
from rlsched.rl import episode_runs as er
from rlsched.rl.assemble import assemble
from rlsched.rl.evaluate import EvalResult, evaluate
from rlsched.rl.feed import ProblemFeed
from rlsched.rl.grpo import LossStats
from rlsched.rl.local_pool import LocalPool
from rlsched.rl.requests import group_requests, run_seed_for_requests, sampling_params
from rlsched.rl.task import TaskProblem, check_prompts, verify_kind_key
from rlsched.rl.tasks import build_task
from rlsched.rl.update import (
    TrainItem,
    TrainOptions,
    minibatches,
    prepare_policy,
    skipped_note,
    update_batch,
)
from verifiers.loading import VerifierSet
from verifiers.protocol import Outcome, Verdict, Verifier, VerifyRequest


@dataclass
class StepRecord:
    step: int
    version: int
    reward: float  # mean reward of the step's samples
    phase_s: dict[str, float]
    loss: float
    clip_fraction: float
    faults: int
    skipped_steps: int = 0  # optimizer steps not taken: a non-finite loss or gradient
    eval_pass_rate: float | None = None
    episodes: dict[str, Any] | None = None  # multi-turn jobs: turns, tool calls, end reasons


@dataclass
class RunReport:
    before: EvalResult
    after: EvalResult
    steps: list[StepRecord] = field(default_factory=list)
    wall_s: float = 0.0
    update_s: float = 0.0

    @property
    def gain_points(self) -> float:
        return 100 * (self.after.pass_rate - self.before.pass_rate)

    def to_json(self) -> dict[str, object]:
        return {
            "before": asdict(self.before),
            "after": asdict(self.after),
            "gain_points": round(self.gain_points, 2),
            "wall_s": round(self.wall_s, 2),
            "update_s": round(self.update_s, 2),
            "steps": [asdict(s) for s in self.steps],
        }


class GRPOLoop:
    def __init__(
        self,
        cfg: JobConfig,
        checkpoint: Checkpoint | None = None,
        verifier: Verifier | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.cfg = cfg
        torch.manual_seed(cfg.run.seed)
        self.ckpt = checkpoint or load_checkpoint(cfg.model.checkpoint, template=cfg.model.template)
        self.policy = prepare_policy(self.ckpt.model, cfg.trainer)
        self.reference = self._frozen_copy() if cfg.grpo.kl_coef > 0 else None
        self.engine = TorchRolloutEngine(
            self._frozen_copy().to(engine_dtype(str(cfg.engine.dtype))),
            self.ckpt.tokenizer,
            max_batch=cfg.engine.max_batch,
            use_cache=cfg.engine.use_cache,
            seed=cfg.run.seed,
            prefix_cache_blocks=PREFIX_CACHE_BLOCKS if cfg.agent.enabled else 0,
            batch_invariant=cfg.engine.batch_invariant,
        )
        self.engine.load_weights(to_bf16_bytes(self.policy), WeightVersion(0))  # the published BF16 values
        self.template = self.ckpt.template
        pad = self.ckpt.tokenizer.pad_token_id
        self.options = TrainOptions.of(cfg.trainer, pad if pad is not None else 0)
        self.task = build_task(cfg.task)
        source = str(cfg.task.path or f"the {cfg.task.name} task")
        ctx = self.ckpt.info.context_length
        tok, max_tokens = self.ckpt.tokenizer, cfg.sampling.max_tokens
        room = check_prompts(self.task, tok, self.template, ctx, max_tokens, source)
        if (note := room.note()) is not None:
            log(note)
        self.verifier = verifier  # a test's stand-in; otherwise each sample's kind from `verifiers`
        self.verifiers = VerifierSet(
            cfg.verifier.kind,
            cfg.verifier.sandbox.policy(),
            cfg.task.rewards(),
            cfg.verifier.timeout.params(),
        )
        self.pool = LocalPool(cfg.verifier, cfg.grpo.verify_retries, rewards=self.verifiers.rewards)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=cfg.grpo.lr, weight_decay=0.0)
        self.feed = ProblemFeed(self.task, cfg.run.seed)  # the training problems, as the Ray job draws them
        # the iteration's one core, in sync mode (`--local` refuses async: one phase at a time), built
        # from the config as the Ray controller builds it
        self.core = iteration_core(cfg)
        self.phases = it.Phases()  # what the core asked for, run in `step`'s order
        for effect in self.core.start():  # the word that iteration 1 may go out
            self.phases.ask(effect)
        self.log = log
        self.sampling = sampling_params(cfg.sampling, self.template)
        self.agent = self._agent_rollout() if cfg.agent.enabled else None
        self.last_eval_episodes: dict[str, Any] | None = None  # the last agent evaluation's counts

    def _agent_rollout(self) -> ag.AgentRollout:
        """Multi-turn episodes with the job's tools (`rlsched.rl.agent`)."""
        return ag.spec_of(self.cfg, self.sampling).rollout(self.engine, self.ckpt.tokenizer)

    def close(self) -> None:
        """Release what the loop holds outside the model: the multi-turn rollout's tool threads."""
        if self.agent is not None:
            self.agent.close()

    def _frozen_copy(self) -> Any:
        return copy.deepcopy(self.policy).eval().requires_grad_(False)

    # -- the iteration -----------------------------------------------------------------------

    def verify(self, sample: Sample, problem: TaskProblem) -> Outcome:
        """Judge one sample now, through the pool's core (`LocalPool`): a retryable execution
        fault is retried up to `verify_retries` times, bad input is not."""
        return self.judge(sample.request_id, sample.text, problem)

    def judge(self, request_id: str, text: str, problem: TaskProblem) -> Outcome:
        verifier = self.verifier or self.verifiers.get(problem.verifier)
        kind, key = verify_kind_key(problem, self.cfg.verifier.kind)
        task = PendingVerification(
            TaskId(request_id), BatchId(f"v{self.version}"), self.pool.clock(), kind=kind, key=key
        )
        return self.pool.verify(task, verifier, VerifyRequest(request_id, text, problem.answer))

    @property
    def version(self) -> WeightVersion:
        return WeightVersion(self.core.version)

    def _feed(self, event: it.Event) -> list[it.Verify]:
        """Hand the core an event: the samples it says to verify now (the phases are kept for later)."""
        verify = []
        for e in self.core.handle(event):
            if isinstance(e, it.Verify):
                verify.append(e)
            else:
                self.phases.ask(e)
        return verify

    def generate_and_verify(
        self, requests: list[GenerationRequest], references: dict[RequestId, TaskProblem]
    ) -> tuple[dict[RequestId, Sample], dict[RequestId, Outcome]]:
        samples: dict[RequestId, Sample] = {}
        outcomes: dict[RequestId, Outcome] = {}
        for sample in self.engine.generate(requests):  # each sample is judged the moment it exists
            samples[sample.request_id] = sample
            arrived = it.SampleArrived(time.monotonic(), sample.request_id, sample.oldest_version)
            for verify in self._feed(arrived):
                for rid in verify.request_ids:
                    outcomes[RequestId(rid)] = self.verify(
                        samples[RequestId(rid)], references[RequestId(rid)]
                    )
                    self._feed(it.Judged(time.monotonic(), rid))
        return samples, outcomes

    def update(self, items: list[TrainItem], step: int) -> LossStats:
        """Iteration `step`'s optimizer steps, one per minibatch (`rlsched.rl.update.update_batch`)."""
        grpo = self.cfg.grpo
        parts = minibatches(items, grpo.minibatches)
        stats = update_batch(
            self.policy, self.optimizer, parts, grpo, steps_done=step * grpo.minibatches,
            options=self.options, reference=self.reference,
        )  # fmt: skip
        if (note := skipped_note(stats, step + 1)) is not None:
            self.log(note)
        return stats

    def publish(self, version: int) -> str:
        """The new version's BF16 bytes go to the engine, as they go to remote instances."""
        blob = to_bf16_bytes(self.policy)
        loaded = self.engine.load_weights(blob, WeightVersion(version))
        if loaded != checksum(blob):
            raise RuntimeError("engine confirmed a different checksum than was published")
        return loaded

    def step(self, step: int) -> StepRecord:
        phase: dict[str, float] = {}
        t = time.monotonic()
        problems = [self.feed.next()[1] for _ in range(self.cfg.grpo.prompts_per_step)]
        iteration = self.phases.take(it.Generate).iteration  # the core's word that it may go out
        if self.agent is not None:
            return self._agent_step(step, iteration, problems)
        requests, references = group_requests(  # 1
            problems,
            self.cfg.grpo.group_size,
            str(iteration),  # as the Ray controller names its requests
            self.ckpt.tokenizer,
            self.template,
            self.sampling,
            run_seed_for_requests(self.cfg),
        )
        self._feed(it.Started(t, iteration, tuple(r.request_id for r in requests)))
        samples, outcomes = self.generate_and_verify(requests, references)  # 2
        phase["generate_verify"] = time.monotonic() - t
        t = time.monotonic()
        update = self.phases.take(it.Update)
        ids = [RequestId(r) for r in update.request_ids]
        batch = assemble(ids, samples, outcomes, self.cfg.grpo.group_size, update.oldest)  # 3
        stats = self.update(batch.items, step) if batch.items else LossStats(0.0, 0.0, 0.0, 1.0)  # 4
        self._feed(it.Updated(time.monotonic()))
        phase["update"] = time.monotonic() - t
        t = time.monotonic()
        version = self.phases.take(it.Publish).version
        self.publish(version)  # 5: the engine loads it in this process, so its reload is done too
        self._feed(it.VersionPublished(time.monotonic(), version))
        self.phases.take(it.Reload)
        self._feed(it.Reloaded(time.monotonic()))
        self.phases.take(it.Committed)
        phase["publish"] = time.monotonic() - t
        rewards = [o.reward for o in outcomes.values() if isinstance(o, Verdict)]
        return StepRecord(
            step=step + 1,
            version=int(self.version),
            reward=sum(rewards) / max(len(rewards), 1),
            phase_s={k: round(v, 3) for k, v in phase.items()},
            loss=stats.loss,
            clip_fraction=stats.clip_fraction,
            faults=batch.faults,
            skipped_steps=stats.skipped,
        )

    def _agent_step(self, step: int, iteration: int, problems: list[TaskProblem]) -> StepRecord:
        """One iteration of multi-turn episodes: each episode is one of the core's samples, judged on
        its final answer; the update trains whole episodes, observations masked."""
        assert self.agent is not None
        t = time.monotonic()
        runs = self.agent.run(problems, self.cfg.grpo.group_size, str(iteration))
        by_id = {r.episode.id: r for r in runs}
        self._feed(it.Started(t, iteration, tuple(by_id)))
        outcomes: dict[str, Outcome] = {}
        for run in runs:
            oldest = min(run.episode.versions, default=int(self.version))
            for verify in self._feed(it.SampleArrived(time.monotonic(), run.episode.id, oldest)):
                for rid in verify.request_ids:
                    outcomes[rid] = self._judge_episode(by_id[rid])
                    self._feed(it.Judged(time.monotonic(), rid))
        generated = time.monotonic() - t
        t = time.monotonic()
        self.phases.take(it.Update)
        items = er.train_items(runs, self.cfg.agent.train_truncated)
        stats = self.update(items, step) if items else LossStats(0.0, 0.0, 0.0, 1.0)
        self._feed(it.Updated(time.monotonic()))
        updated = time.monotonic() - t
        t = time.monotonic()
        version = self.phases.take(it.Publish).version
        self.publish(version)
        self._feed(it.VersionPublished(time.monotonic(), version))
        self.phases.take(it.Reload)
        self._feed(it.Reloaded(time.monotonic()))
        self.phases.take(it.Committed)
        rewards = [o.reward for o in outcomes.values() if isinstance(o, Verdict)]
        summary = er.stats(runs)
        return StepRecord(
            step=step + 1,
            version=int(self.version),
            reward=sum(rewards) / max(len(rewards), 1),
            phase_s={
                "episodes": round(generated, 3),
                "update": round(updated, 3),
                "publish": round(time.monotonic() - t, 3),
            },
            loss=stats.loss,
            clip_fraction=stats.clip_fraction,
            faults=summary.faults,
            skipped_steps=stats.skipped,
            episodes=asdict(summary) | {"trained": len(items)},
        )

    def _judge_episode(self, run: er.EpisodeRun) -> Outcome:
        """An episode's reward: its final answer judged (a fault is not judged: it is not trained)."""
        if run.fault is not None:
            return er.fault_outcome(run)
        outcome = self.judge(run.episode.id, run.answer, run.problem)
        run.episode.reward = outcome.reward if isinstance(outcome, Verdict) else None
        return outcome

    # -- the run -----------------------------------------------------------------------------

    def evaluate(self, size: int | None = None) -> EvalResult:
        problems = self.task.eval_problems if size is None else self.task.eval_problems[:size]
        if self.agent is not None:
            return self._agent_evaluate(problems)
        return evaluate(
            self.engine,
            self.ckpt.tokenizer,
            self.template,
            problems,
            max_tokens=self.cfg.sampling.max_tokens,
            verifiers=self.verifiers,
        )

    def run(self) -> RunReport:
        start = time.monotonic()
        before = self.evaluate()
        self.log(f"held-out pass rate before: {before}")
        records: list[StepRecord] = []
        t_update = time.monotonic()
        rules = run_rules(self.cfg)
        for step in range(self.cfg.grpo.steps):
            if rules.out_of_time(time.monotonic() - t_update):
                self.log(f"time budget of {self.cfg.grpo.time_budget_s:.0f} s reached after {step} steps")
                break
            rec = self.step(step)
            if rules.eval_due(rec.step):
                rec.eval_pass_rate = self.evaluate(self.cfg.eval.curve_size).pass_rate
            records.append(rec)
            if rec.eval_pass_rate is not None:
                self.log(self._progress_line(rec, time.monotonic() - t_update))
            elif rec.episodes is not None:  # multi-turn steps are long: a line each
                self.log(self._episodes_line(rec, time.monotonic() - t_update))
        update_s = time.monotonic() - t_update
        after = self.evaluate()
        self.log(
            f"held-out pass rate after:  {after}  ({100 * (after.pass_rate - before.pass_rate):+.1f} points)"
        )
        return RunReport(
            before=before, after=after, steps=records, wall_s=time.monotonic() - start, update_s=update_s
        )

    def _passes(self, run: er.EpisodeRun) -> bool:
        outcome = self.judge(run.episode.id, run.answer, run.problem)
        return isinstance(outcome, Verdict) and outcome.correct

    def _agent_evaluate(self, problems: Sequence[TaskProblem]) -> EvalResult:
        """Greedy episodes on held-out problems: the share whose final answer is right (an
        environment fault counts as not passed, and is counted)."""
        assert self.agent is not None
        greedy = dataclasses.replace(self.sampling, temperature=0.0)
        runs = self.agent.run(problems, 1, "eval", params=greedy)
        passed = sum(run.fault is None and self._passes(run) for run in runs)
        summary = er.stats(runs)
        self.last_eval_episodes = asdict(summary)
        return EvalResult(passed / len(runs), passed, len(runs), passed / len(runs))

    @staticmethod
    def _episodes_line(rec: StepRecord, elapsed: float) -> str:
        e = rec.episodes or {}
        ends = ", ".join(f"{k} {v}" for k, v in sorted(e.get("ends", {}).items()))
        return (
            f"step {rec.step:4d}  v{rec.version:<4d} reward {rec.reward:.3f}  turns {e.get('turns', 0):.2f}  "
            f"tool calls {e.get('tool_calls', 0):.2f}  ends: {ends}  {elapsed:6.1f} s"
        )

    @staticmethod
    def _progress_line(rec: StepRecord, elapsed: float) -> str:
        return (
            f"step {rec.step:4d}  v{rec.version:<4d} reward {rec.reward:.3f}  loss {rec.loss:+.4f}  "
            f"clip {rec.clip_fraction:.3f}  eval {100 * (rec.eval_pass_rate or 0):5.1f}%  {elapsed:6.1f} s"
        )


def write_outputs(loop: GRPOLoop, report: RunReport, out_dir: Path) -> tuple[Path, Path]:
    """`report.json` and the trained policy as a checkpoint directory (`rlsched generate --checkpoint`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps(report.to_json(), indent=1))
    blob = to_bf16_bytes(loop.policy)
    ckpt = write_checkpoint(loop.ckpt.path, blob, out_dir / "checkpoint", loop.cfg.model.template)
    return path, ckpt


def iteration_core(cfg: JobConfig, version: int = 0, at: float = 0.0, steps: int = 0) -> PipelineCore:
    """`--local`'s iteration core for a job config, built as the Ray driver builds its own (from
    version `version` at time `at`, `steps` steps committed)."""
    return PipelineCore(pipeline_params(cfg), version=version, at=at, steps=steps)

"""The single-process GRPO loop (`rlsched run --local`): the iteration's one core (sync mode), driven
in one process. The rollout engine holds its own copy of the weights and receives each new version as
BF16 safetensors bytes, exactly as a remote instance does. Each iteration, as the core asks:

1. a wave of `prompts_per_step` problems goes out through the producer (`rlsched.rl.local_arrivals`):
   `group_size` samples each, or episodes with the job's tools for a multi-turn job;
2. each sample (or episode's final answer) is judged when the core says: at once, as it arrives;
   execution faults retried, never scored 0;
3. the batch the core names is assembled (group-relative advantages) and trained: one clipped
   policy-gradient step per minibatch on the fp32 master weights;
4. the BF16 bytes of the new weights are loaded into the engine as the next version.

With `rollout.endpoint.enabled`, the OpenAI endpoint serves from the same engine on a thread of this
process (`rlsched.rl.local_endpoint`): its clients' episodes are judged beside the wave's samples and
join the batch at the update, as in a Ray job.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from rlsched.config import JobConfig
from rlsched.config_agent import PREFIX_CACHE_BLOCKS
from rlsched.config_params import pipeline_params, run_rules
from rlsched.core import iteration as it
from rlsched.core.pipeline import PipelineCore
from rlsched.engine.protocol import RequestId, WeightVersion
from rlsched.engine.torch_engine import TorchRolloutEngine, engine_dtype
from rlsched.model.checkpoint import Checkpoint, checksum, load_checkpoint, to_bf16_bytes, write_checkpoint
from rlsched.policy.verify import BatchId, PendingVerification, TaskId
from rlsched.rl import agent as ag
from rlsched.rl import episode_runs as er
from rlsched.rl.evaluate import EvalResult, evaluate
from rlsched.rl.feed import ProblemFeed
from rlsched.rl.grpo import LossStats
from rlsched.rl.local_arrivals import Batch, Episodes, Producer, Samples
from rlsched.rl.local_endpoint import LocalEndpoint
from rlsched.rl.local_pool import LocalPool
from rlsched.rl.requests import sampling_params
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
    endpoint: dict[str, int] | None = None  # with the endpoint: its episodes taken, trained, left out


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
        self.producer: Producer = (
            Episodes(cfg, self.agent, self.judge)
            if self.agent is not None
            else Samples(cfg, self.engine, self.template, self.sampling, self.judge)
        )
        self.last_eval_episodes: dict[str, Any] | None = None  # the last agent evaluation's counts
        self.endpoint = (
            LocalEndpoint(cfg, self.engine, self.verifiers, log) if cfg.rollout.endpoint.enabled else None
        )

    def _agent_rollout(self) -> ag.AgentRollout:
        """Multi-turn episodes with the job's tools (`rlsched.rl.agent`)."""
        return ag.spec_of(self.cfg, self.sampling).rollout(self.engine, self.ckpt.tokenizer)

    def close(self) -> None:
        """Release what the loop holds outside the model: the endpoint's server, the multi-turn
        rollout's tool threads."""
        if self.endpoint is not None:
            self.endpoint.stop()
        if self.agent is not None:
            self.agent.close()

    def _frozen_copy(self) -> Any:
        return copy.deepcopy(self.policy).eval().requires_grad_(False)

    # -- the iteration -----------------------------------------------------------------------

    def judge(self, request_id: str, text: str, problem: TaskProblem) -> Outcome:
        """Judge one sample now, through the pool's core (`LocalPool`): a retryable execution fault is
        retried up to `verify_retries` times, bad input is not."""
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
        """One iteration, as the core asks for each phase: a wave of problems goes out, each sample
        (or episode) is judged when the core says, the batch it names trains, and the new version is
        published to the engine. Single-turn and multi-turn alike, through the producer; with the
        endpoint, its clients' episodes are judged beside the wave's and join the batch."""
        t = time.monotonic()
        problems = [self.feed.next()[1] for _ in range(self.cfg.grpo.prompts_per_step)]
        iteration = self.phases.take(it.Generate).iteration  # the core's word that it may go out
        wave = self.producer.begin(problems, iteration, int(self.version))
        outcomes: dict[str, Outcome] = {}
        self._settle(self._feed(it.Started(t, iteration, wave.ids)), outcomes)
        self._settle(self._offer(), outcomes)
        for rid, oldest in wave.arrivals:
            self._settle(self._feed(it.SampleArrived(time.monotonic(), rid, oldest)), outcomes)
            self._settle(self._offer(), outcomes)
        phase = {self.producer.phase: time.monotonic() - t}
        t = time.monotonic()
        update = self.phases.take(it.Update)
        batch, endpoint = self._batch(update, outcomes)
        stats = self.update(batch.items, step) if batch.items else LossStats(0.0, 0.0, 0.0, 1.0)
        self._feed(it.Updated(time.monotonic()))
        phase["update"] = time.monotonic() - t
        t = time.monotonic()
        version = self.phases.take(it.Publish).version
        self.publish(version)  # the engine loads it in this process, so its reload is done too
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
            episodes=batch.episodes,
            endpoint=endpoint,
        )

    def _settle(self, verify: list[it.Verify], outcomes: dict[str, Outcome]) -> None:
        """Judge what the core says to verify now: the wave's samples and the endpoint's episodes."""
        for v in verify:
            for r in v.request_ids:
                if self.endpoint is not None and self.endpoint.owns(r):
                    outcomes[r] = self.endpoint.judge(r, self.judge)
                else:
                    outcomes[r] = self.producer.judge(r)
                self._feed(it.Judged(time.monotonic(), r))

    def _offer(self) -> list[it.Verify]:
        """The endpoint's episodes that wait for a verdict join the wave that generates (`Offered`)."""
        if self.endpoint is None or not self.core.takes_offers:
            return []
        offered = self.endpoint.offer()
        return self._feed(it.Offered(time.monotonic(), offered)) if offered else []

    def _batch(self, update: it.Update, outcomes: dict[str, Outcome]) -> tuple[Batch, dict[str, int] | None]:
        """The wave's batch as the core names it; with the endpoint, the verdicts of its episodes sent
        back (their outcomes leave `outcomes`) and those ready joining the batch."""
        if self.endpoint is None:
            return self.producer.batch(update, outcomes), None
        judged = self.endpoint.reward(cast(dict[RequestId, Outcome], outcomes))
        batch = self.producer.batch(update, outcomes)
        more, counts = self.endpoint.take(update.iteration, update.oldest)
        return dataclasses.replace(batch, items=[*batch.items, *more]), counts | judged

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
                self.log(self._progress_line(rec, time.monotonic() - t_update) + _endpoint_note(rec))
            elif rec.episodes is not None:  # multi-turn steps are long: a line each
                self.log(self._episodes_line(rec, time.monotonic() - t_update) + _endpoint_note(rec))
            elif rec.endpoint is not None and rec.endpoint["episodes"]:
                self.log(f"step {rec.step:4d}  v{rec.version:<4d}{_endpoint_note(rec)}")
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


def _endpoint_note(rec: StepRecord) -> str:
    """The endpoint's episodes in a step's line: how many it took and trained (nothing without)."""
    e = rec.endpoint
    if not e or not e["episodes"]:
        return ""
    return f"  endpoint: {e['episodes_trained']} of {e['episodes']} episode(s) trained"


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

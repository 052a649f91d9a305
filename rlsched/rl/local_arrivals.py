"""What produces `--local`'s samples, as its one iteration driver (`rlsched.rl.loop.GRPOLoop.step`)
sees them: the same port for single-turn samples and multi-turn episodes, as the Ray driver's
producers (`rlsched.job.arrivals`) are.

A producer starts a wave of problems (`begin`: its request ids, and the arrivals, each with the
oldest version of its tokens, as they come), judges the one the core says to verify (`judge`), and
makes the training batch once the core asks for the update (`batch`). `Samples` generates on the
in-process engine and yields each sample the moment it exists; `Episodes` runs whole episodes with
the job's tools, one per member of a group, judged on the final answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from rlsched.config import JobConfig
from rlsched.core import iteration as it
from rlsched.engine.protocol import RequestId, Sample, SamplingParams
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.template import PromptFormat
from rlsched.rl import agent as ag
from rlsched.rl import episode_runs as er
from rlsched.rl.assemble import assemble
from rlsched.rl.requests import group_requests, run_seed_for_requests
from rlsched.rl.task import TaskProblem
from rlsched.rl.update import TrainItem
from verifiers.protocol import Outcome, Verdict

Judge = Callable[[str, str, TaskProblem], Outcome]  # (request id, text, problem): the verdict


@dataclass(frozen=True)
class Wave:
    ids: tuple[str, ...]  # its request ids, group by group
    arrivals: Iterator[tuple[str, int]]  # (request id, the oldest version of its tokens), as they come


@dataclass(frozen=True)
class Batch:
    items: list[TrainItem]
    faults: int  # samples or episodes left out as execution faults
    episodes: dict[str, Any] | None = None  # a multi-turn wave's figures (turns, tool calls, ends)


class Producer(Protocol):
    phase: str  # what its time is called in a step's record

    def begin(self, problems: Sequence[TaskProblem], wave: int, version: int) -> Wave: ...

    def judge(self, rid: str) -> Outcome: ...

    def batch(self, update: it.Update, outcomes: dict[str, Outcome]) -> Batch: ...


class Samples:
    """Single-turn: `group_size` requests for each problem, generated at once on the engine."""

    phase = "generate_verify"

    def __init__(
        self,
        cfg: JobConfig,
        engine: TorchRolloutEngine,
        template: PromptFormat,
        sampling: SamplingParams,
        judge: Judge,
    ) -> None:
        self.cfg, self.engine, self.template, self.sampling, self._judge = (
            cfg,
            engine,
            template,
            sampling,
            judge,
        )
        self.samples: dict[RequestId, Sample] = {}
        self.problems: dict[RequestId, TaskProblem] = {}

    def begin(self, problems: Sequence[TaskProblem], wave: int, version: int) -> Wave:
        requests, self.problems = group_requests(
            list(problems), self.cfg.grpo.group_size, str(wave),  # as the Ray controller names them
            self.engine.tokenizer, self.template, self.sampling, run_seed_for_requests(self.cfg),
        )  # fmt: skip
        self.samples = {}
        return Wave(tuple(r.request_id for r in requests), self._arrivals(requests))

    def _arrivals(self, requests: Sequence[Any]) -> Iterator[tuple[str, int]]:
        for sample in self.engine.generate(requests):  # each one judged the moment it exists
            self.samples[sample.request_id] = sample
            yield sample.request_id, sample.oldest_version

    def judge(self, rid: str) -> Outcome:
        sample = self.samples[RequestId(rid)]
        return self._judge(rid, sample.text, self.problems[RequestId(rid)])

    def batch(self, update: it.Update, outcomes: dict[str, Outcome]) -> Batch:
        ids = [RequestId(r) for r in update.request_ids if RequestId(r) in self.samples]  # not episodes
        judged = {RequestId(r): o for r, o in outcomes.items()}
        done = assemble(ids, self.samples, judged, self.cfg.grpo.group_size, update.oldest)
        return Batch(done.items, done.faults)


class Episodes:
    """Multi-turn: one episode per member of a group, with the job's tools; each is one of the core's
    samples, judged on its final answer, trained whole with the observations masked."""

    phase = "episodes"

    def __init__(self, cfg: JobConfig, agent: ag.AgentRollout, judge: Judge) -> None:
        self.cfg, self.agent, self._judge = cfg, agent, judge
        self.runs: dict[str, er.EpisodeRun] = {}

    def begin(self, problems: Sequence[TaskProblem], wave: int, version: int) -> Wave:
        runs = self.agent.run(problems, self.cfg.grpo.group_size, str(wave))
        self.runs = {r.episode.id: r for r in runs}
        arrivals = ((r.episode.id, min(r.episode.versions, default=version)) for r in runs)
        return Wave(tuple(self.runs), arrivals)

    def judge(self, rid: str) -> Outcome:
        """An episode's reward: its final answer judged (a fault is not judged: it is not trained)."""
        run = self.runs[rid]
        if run.fault is not None:
            return er.fault_outcome(run)
        outcome = self._judge(run.episode.id, run.answer, run.problem)
        run.episode.reward = outcome.reward if isinstance(outcome, Verdict) else None
        return outcome

    def batch(self, update: it.Update, outcomes: dict[str, Outcome]) -> Batch:
        runs = list(self.runs.values())
        items = er.train_items(runs, self.cfg.agent.train_truncated)
        summary = er.stats(runs)
        return Batch(items, summary.faults, asdict(summary) | {"trained": len(items)})

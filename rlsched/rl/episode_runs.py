"""One multi-turn episode as it runs (`rlsched.rl.agent`): its record, its conversation and its
counts, what the round journal keeps of it and how it resumes from there, and the scoring of a batch
of them (faults never trained, truncated ones where the job says, advantages over whole episodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from environments.protocol import Observation
from environments.sandboxed import ToolEnvironments
from rlsched.rl.episodes import EpisodeBatch, episode_batch
from rlsched.rl.task import TaskProblem
from rlsched.rl.update import TrainItem
from rlsched.serve.episodes import EndReason, Episode
from rlsched.serve.tools import ParsedCall
from rlsched.store.round_journal import Saved
from verifiers.protocol import ExecutionFault, FaultKind

LIMITS = frozenset({EndReason.MAX_TURNS, EndReason.MAX_TOKENS, EndReason.WALL_TIME, EndReason.LENGTH})


@dataclass(frozen=True)
class EpisodeTask:
    """An episode to run: its id (`PREFIX-PLACE-MEMBER`), its group (`PREFIX-PLACE`) and its problem."""

    episode_id: str
    group_id: str
    problem: TaskProblem


def group_tasks(
    problems: Sequence[TaskProblem], group_size: int, prefix: str, places: Sequence[int] | None = None
) -> list[EpisodeTask]:
    """`group_size` episodes of each problem, grouped by its place (its index, or its entry in `places`)."""
    at = list(places) if places is not None else list(range(len(problems)))
    return [
        EpisodeTask(f"{prefix}-{i}-{k}", f"{prefix}-{i}", p)
        for i, p in zip(at, problems, strict=True)
        for k in range(group_size)
    ]


@dataclass
class EpisodeRun:
    """One episode as it runs: the record, the conversation the template renders, and its counts."""

    episode: Episode
    problem: TaskProblem
    env: ToolEnvironments  # closed with the episode (what it used stays countable)
    messages: list[dict[str, Any]]
    first_prompt: int  # tokens of the first prompt
    started: float
    next_ids: list[int] = field(default_factory=list)  # the next turn's prompt
    extends: bool = True  # it extends the last turn's prompt and reply (the template kept them as sampled)
    diverged_at: int | None = None  # where it stops extending them, where it does not
    answer: str = ""  # the last reply's text: what is scored
    tool_calls: int = 0
    tool_errors: int = 0
    malformed: int = 0
    tool_s: float = 0.0
    cached_tokens: int = 0
    fault: str | None = None  # the environment failed past its retries: not scored, not trained
    open_calls: list[ParsedCall] | None = None  # the calls of the round under way (its reply is in)
    done: dict[str, Observation] = field(default_factory=dict)  # those a journal says ran already

    def state(self, now: float) -> dict[str, Any]:
        """What the round journal keeps of it (`rlsched.store.round_journal`)."""
        calls = None if self.open_calls is None else [[c.id, c.name, c.arguments] for c in self.open_calls]
        return {
            "episode": self.episode.as_json(),
            "messages": self.messages,
            "first_prompt": self.first_prompt,
            "elapsed_s": now - self.started,
            "next_ids": self.next_ids,
            "extends": self.extends,
            "diverged_at": self.diverged_at,
            "answer": self.answer,
            "counts": [self.tool_calls, self.tool_errors, self.malformed, self.tool_s, self.cached_tokens],
            "fault": self.fault,
            "open_calls": calls,
        }

    @classmethod
    def resumed(cls, saved: Saved, problem: TaskProblem, env: ToolEnvironments, now: float) -> EpisodeRun:
        """The episode where its journal left it: the calls of its open round that ran are in `done`."""
        s = saved.state
        run = cls(
            Episode.from_json(s["episode"]), problem, env, s["messages"], s["first_prompt"],
            now - s["elapsed_s"], s["next_ids"], s["extends"], s["diverged_at"], s["answer"],
        )  # fmt: skip
        run.tool_calls, run.tool_errors, run.malformed, run.tool_s, run.cached_tokens = s["counts"]
        run.fault = s["fault"]
        if s["open_calls"] is not None:
            run.open_calls = [ParsedCall(*c) for c in s["open_calls"]]
        run.done = {i: Observation(**o) for i, o in saved.calls.items()}
        return run

    @property
    def live(self) -> bool:
        return self.episode.ended is None

    @property
    def truncated(self) -> bool:
        return self.episode.ended in LIMITS

    @property
    def turns(self) -> int:
        return len(self.episode.turns)


@dataclass(frozen=True)
class AgentStats:
    episodes: int
    faults: int
    truncated: int
    turns: float  # per episode, mean
    tool_calls: float  # per episode, mean
    tool_errors: int
    malformed: int
    ends: dict[str, int]


def stats(runs: Sequence[EpisodeRun]) -> AgentStats:
    ends: dict[str, int] = {}
    for r in runs:
        key = str(r.episode.ended)
        ends[key] = ends.get(key, 0) + 1
    return AgentStats(
        episodes=len(runs),
        faults=sum(r.fault is not None for r in runs),
        truncated=sum(r.truncated for r in runs),
        turns=mean(r.turns for r in runs) if runs else 0.0,
        tool_calls=mean(r.tool_calls for r in runs) if runs else 0.0,
        tool_errors=sum(r.tool_errors for r in runs),
        malformed=sum(r.malformed for r in runs),
        ends=ends,
    )


def fault_outcome(run: EpisodeRun) -> ExecutionFault:
    """The outcome of an episode whose environment failed past its retries: a fault, judged by no
    verifier, never a zero reward."""
    return ExecutionFault(run.episode.id, FaultKind.RESOURCES, f"environment: {run.fault}")


def train_batch(runs: Sequence[EpisodeRun], train_truncated: bool) -> EpisodeBatch:
    """The scored episodes as a batch (faults left out, and truncated ones unless trained on). An
    episode whose wall-time limit ran out before its first reply has no tokens to train on: it is
    left out too (it still counts in the iteration's figures)."""
    usable = [
        r.episode
        for r in runs
        if r.fault is None
        and r.episode.reward is not None
        and r.episode.turns
        and (train_truncated or not r.truncated)
    ]
    return episode_batch(usable, keep_mixed=True)


def train_items(runs: Sequence[EpisodeRun], train_truncated: bool) -> list[TrainItem]:
    return train_batch(runs, train_truncated).items

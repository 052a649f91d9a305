"""Trajectory capture: the endpoint's requests that carry an episode id, recorded token by token, so
that an agent program driven over HTTP yields training data whose every token is one the engine
sampled.

An episode is one conversation. Each request in it (a turn) records the prompt ids as templated, the
sampled ids with their raw log-probs, the weight version that sampled them, and when it was
submitted, first answered and finished. Turns are stitched by prefix: turn k+1's prompt must extend
turn k's prompt plus its sampled ids. `continue_prompt` builds that prompt from the recorded ids
rather than a re-tokenization of the reply's text (which does not give back the sampled tokens): the
new conversation's templated text must begin with the text of the recorded ids, and only the rest
(the tool's result, the next user turn, the template's tokens around them) is tokenized. Where it
does not (the client edited the history), the prompt is tokenized whole, and the turn records that it
does not extend and where it diverges: the mismatch is kept, not hidden.

With a journal (a job's endpoint), every change of an episode is written to the run's
`episodes.sqlite` as it happens; after a crash the job's endpoint takes back the open episodes, those
waiting for a reward, and those a lost iteration had taken (`EpisodeStore.restore`).

An episode ends with a turn that calls no tool (the agent's final answer) or when the client says
so (`end`). Its reward comes from the client (`POST /v1/episodes/{id}/reward`) or a verifier; an
ended episode whose reward has not come within `reward_timeout_s` is dropped and counted. Episodes
form GRPO groups by `group_id` (by default the episode's own id; a first turn with `n` choices
starts `n` episodes, `ID-0` ... `ID-{n-1}`, in group `ID`).

`training_sequence` turns a stitched episode into one sequence for the trainer: the first turn's
prompt, then everything after it, with the loss mask on the sampled ids only and their behaviour
log-probs (`rlsched.rl.update.TrainItem`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlsched.model.content import Rendered
from rlsched.model.tokenizer import Tokenizer
from rlsched.store.episode_journal import EpisodeJournal
from verifiers.protocol import UNIT_REWARDS, RewardRange

Clock = Callable[[], float]


class EndReason(StrEnum):
    FINAL_ANSWER = "no_tool_call"  # a turn that called no tool
    CLIENT = "client"  # POST /v1/episodes/{id}/end, or a reward
    # an in-job episode (`rlsched.rl.agent`) cut off by a limit, scored as it stands
    MAX_TURNS = "max_turns"  # its last turn called a tool that no turn is left to read
    MAX_TOKENS = "max_tokens"  # its tokens after the first prompt reached agent.max_tokens
    WALL_TIME = "wall_time"  # it ran past agent.max_wall_s
    LENGTH = "length"  # a reply was cut off at sampling.max_tokens or the model's context
    ENV_FAULT = "environment_fault"  # its environment failed past its retries: not scored


class EpisodeError(ValueError):
    """A request about an episode that cannot be honoured (the status says why)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Turn:
    request_id: str
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_version: int
    submitted: float
    first_token: float | None
    finished: float
    finish_reason: str
    called_tool: bool
    extends: bool  # the prompt extends the previous turn's prompt and sampled ids (True for the first)
    diverged_at: int | None = None  # where it stops extending them, when it does not
    started_version: int | None = None  # a new version came in while it ran: the one it began at

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "prompt_ids": list(self.prompt_ids),
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "weight_version": self.weight_version,
            "submitted": self.submitted,
            "first_token": self.first_token,
            "finished": self.finished,
            "finish_reason": self.finish_reason,
            "called_tool": self.called_tool,
            "extends": self.extends,
            "diverged_at": self.diverged_at,
            "started_version": self.started_version,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Turn:
        return cls(
            d["request_id"], tuple(d["prompt_ids"]), tuple(d["token_ids"]), tuple(d["logprobs"]),
            d["weight_version"], d["submitted"], d["first_token"], d["finished"], d["finish_reason"],
            d["called_tool"], d["extends"], d["diverged_at"], d["started_version"],
        )  # fmt: skip


@dataclass
class Episode:
    id: str
    group_id: str
    created: float
    turns: list[Turn] = field(default_factory=list)
    ended: EndReason | None = None
    ended_at: float | None = None
    reward: float | None = None
    reference: str | None = None  # set: a job's verifier judges the final answer against it
    judging: bool = False  # handed to a verifier; its reward comes from there

    @property
    def stitched(self) -> bool:
        """Every turn extends the one before: one token sequence, no gap."""
        return all(t.extends for t in self.turns)

    @property
    def versions(self) -> list[int]:
        """Every version that sampled a token of it (a turn that ran across a swap counts both)."""
        started = {t.started_version for t in self.turns if t.started_version is not None}
        return sorted({t.weight_version for t in self.turns} | started)

    @property
    def mixed(self) -> bool:
        """Its turns were sampled by more than one weight version."""
        return len(self.versions) > 1

    @property
    def ready(self) -> bool:
        return self.ended is not None and self.reward is not None

    def history(self) -> tuple[int, ...]:
        """The last turn's prompt and sampled ids: what the next turn's prompt must extend."""
        last = self.turns[-1]
        return (*last.prompt_ids, *last.token_ids)

    def summary(self) -> dict[str, Any]:
        """`as_json` with the number of turns instead of the turns."""
        return {k: v for k, v in self.as_json().items() if k != "turns"} | {"turns": len(self.turns)}

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group_id": self.group_id,
            "created": self.created,
            "ended": None if self.ended is None else str(self.ended),
            "ended_at": self.ended_at,
            "reward": self.reward,
            "reference": self.reference,
            "judging": self.judging,
            "stitched": self.stitched,
            "mixed": self.mixed,
            "versions": self.versions,
            "turns": [t.as_json() for t in self.turns],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Episode:
        """What `as_json` wrote (its derived fields, stitched, mixed, versions, are recomputed)."""
        return cls(
            d["id"], d["group_id"], d["created"], [Turn.from_json(t) for t in d["turns"]],
            None if d["ended"] is None else EndReason(d["ended"]), d["ended_at"], d["reward"],
            d["reference"], d["judging"],
        )  # fmt: skip


@dataclass(frozen=True)
class TrainingSequence:
    prompt_ids: tuple[int, ...]  # the first turn's prompt
    token_ids: tuple[int, ...]  # everything after it, to the end of the last turn's reply
    logprobs: tuple[float, ...]  # the behaviour log-prob of each sampled token, 0 elsewhere
    mask: tuple[float, ...]  # 1 on sampled tokens, 0 on tool results and template tokens


def training_sequence(episode: Episode) -> TrainingSequence:
    """The stitched episode as one sequence; refused (ValueError) when it is not stitched."""
    if not episode.turns:
        raise ValueError(f"episode {episode.id} has no turns")
    if not episode.stitched:
        bad = next(t for t in episode.turns if not t.extends)
        raise ValueError(
            f"episode {episode.id} is not one sequence: turn {bad.request_id} does not extend the one "
            f"before it (from token {bad.diverged_at})"
        )
    first = len(episode.turns[0].prompt_ids)
    full = episode.history()
    mask = [0.0] * (len(full) - first)
    logprobs = [0.0] * (len(full) - first)
    for turn in episode.turns:
        start = len(turn.prompt_ids) - first
        for k, lp in enumerate(turn.logprobs):
            mask[start + k] = 1.0
            logprobs[start + k] = lp
    return TrainingSequence(full[:first], full[first:], tuple(logprobs), tuple(mask))


def continue_prompt(
    episode: Episode | None, rendered: Rendered, tokenizer: Tokenizer, prefix_ids: Sequence[int] = ()
) -> tuple[list[int], bool, int | None]:
    """The prompt ids for the templated text of a turn in `episode` (after `prefix_ids`, the MLC
    template's system prefix), and whether they extend its last turn (and where not). Special tokens'
    strings that the messages wrote stay text (`rlsched.model.content`)."""
    whole = [*prefix_ids, *rendered.encode(tokenizer)]
    if episode is None or not episode.turns:
        return whole, True, None
    history = list(episode.history())
    said = tokenizer.decode(history[len(prefix_ids) :], skip_special_tokens=False)
    if rendered.text.startswith(said):
        return [*history, *rendered.encode(tokenizer, len(said))], True, None
    if whole[: len(history)] == history:
        return whole, True, None
    diverged = next((k for k, (a, b) in enumerate(zip(whole, history, strict=False)) if a != b), len(whole))
    return whole, False, diverged


class EpisodeStore:
    """The endpoint's episodes, in memory; with a `journal` (a job's endpoint), each change is also
    written to disk as it happens, and `restore` takes them back after a crash
    (`rlsched.store.episode_journal`)."""

    def __init__(
        self,
        reward_timeout_s: float = 600.0,
        clock: Clock = time.time,
        journal: EpisodeJournal | None = None,
        rewards: RewardRange = UNIT_REWARDS,
    ) -> None:
        self.reward_timeout_s = reward_timeout_s
        self.rewards = rewards  # the job's task's range: a reward outside it is refused (422)
        self.clock = clock
        self.journal = journal
        self._episodes: dict[str, Episode] = {}
        self.dropped_no_reward = 0

    def _save(self, episode: Episode) -> Episode:
        if self.journal is not None:
            self.journal.save(episode.id, episode.as_json())
        return episode

    def restore(self, after: int) -> int:
        """After a crash, or a training group rebuilt from the checkpoint of iteration `after`: the
        journal's episodes not yet taken, or taken by an iteration after it, back in the store (an
        episode handed to a verifier that never answered is handed out again; one waiting for its
        reward waits `reward_timeout_s` from now). How many came back."""
        if self.journal is None:
            return 0
        back = 0
        for body in self.journal.load(after):
            episode = Episode.from_json(body)
            if episode.id in self._episodes:
                continue
            if episode.reward is None:
                episode.judging = False
                episode.ended_at = None if episode.ended is None else self.clock()
            self._episodes[episode.id] = self._save(episode)
            back += 1
        return back

    def checkpointed(self, iteration: int) -> None:
        """A checkpoint holds the iterations up to `iteration`: the episodes they took are done."""
        if self.journal is not None:
            self.journal.checkpointed(iteration)

    def __len__(self) -> int:
        return len(self._episodes)

    def get(self, episode_id: str) -> Episode:
        self._expire()
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EpisodeError(404, f"no episode '{episode_id}' (it never started, or it was dropped)")
        return episode

    def find(self, episode_id: str) -> Episode | None:
        self._expire()
        return self._episodes.get(episode_id)

    def open_turn(self, episode_id: str) -> Episode | None:
        """The episode a new turn continues (None: the turn starts it); refused once it ended."""
        episode = self.find(episode_id)
        if episode is not None and episode.ended is not None:
            raise EpisodeError(
                409, f"episode '{episode_id}' ended ({episode.ended}); start a new episode id for a new one"
            )
        return episode

    def record(
        self, episode_id: str, group_id: str | None, turn: Turn, reference: str | None = None
    ) -> Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            episode = Episode(episode_id, group_id or episode_id, self.clock())
            self._episodes[episode_id] = episode
        episode.turns.append(turn)
        if reference is not None:
            episode.reference = reference
        if not turn.called_tool and turn.finish_reason != "length":
            self._end(episode, EndReason.FINAL_ANSWER)
        return self._save(episode)

    def end(self, episode_id: str) -> Episode:
        episode = self.get(episode_id)
        if episode.ended is None:
            self._end(episode, EndReason.CLIENT)
        return self._save(episode)

    def reward(self, episode_id: str, reward: float, judged: bool = False) -> Episode:
        """The episode's reward: from the client, or (`judged`) from the verifier it was handed to."""
        episode = self.get(episode_id)
        if episode.reward is not None:
            raise EpisodeError(409, f"episode '{episode_id}' already has its reward ({episode.reward})")
        if episode.judging and not judged:
            raise EpisodeError(409, f"episode '{episode_id}' is being judged by the job's verifier")
        if (problem := self.rewards.problem(reward)) is not None:
            raise EpisodeError(422, f"episode '{episode_id}': {problem}; it was not recorded")
        episode.reward = reward
        if episode.ended is None:
            self._end(episode, EndReason.CLIENT)
        return self._save(episode)

    def all(self) -> list[Episode]:
        self._expire()
        return sorted(self._episodes.values(), key=lambda e: e.created)

    def ready(self) -> list[Episode]:
        """Ended, rewarded episodes, oldest first."""
        self._expire()
        return sorted((e for e in self._episodes.values() if e.ready), key=lambda e: e.created)

    def to_judge(self) -> list[Episode]:
        """Ended episodes with a reference and no reward, not yet handed out: each handed to the
        job's verifier once (a verifier that never answers leaves it to the reward timeout)."""
        self._expire()
        due = [
            e
            for e in self._episodes.values()
            if e.ended is not None and e.reward is None and e.reference is not None and not e.judging
        ]
        for e in due:
            e.judging = True
            self._save(e)
        return sorted(due, key=lambda e: e.created)

    def take(self, episode_ids: Sequence[str], iteration: int = 0) -> list[Episode]:
        """Remove and return these episodes (training iteration `iteration` took them as its batch;
        the journal keeps them until a checkpoint holds that iteration)."""
        taken = [self._episodes.pop(i) for i in episode_ids if i in self._episodes]
        if self.journal is not None:
            self.journal.taken([e.id for e in taken], iteration)
        return taken

    def _end(self, episode: Episode, why: EndReason) -> None:
        episode.ended, episode.ended_at = why, self.clock()

    def _expire(self) -> None:
        now = self.clock()
        late = [
            e.id
            for e in self._episodes.values()
            if e.ended_at is not None and e.reward is None and now - e.ended_at > self.reward_timeout_s
        ]
        for episode_id in late:
            del self._episodes[episode_id]
        if late and self.journal is not None:
            self.journal.forget(late)
        self.dropped_no_reward += len(late)

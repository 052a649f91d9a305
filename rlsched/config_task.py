"""The `task` section of a job: what the policy is trained and evaluated on.

The shipped toy (`addition`), generated word problems for the `math` verifier (`arithmetic`), your
own prompts and references (`jsonl`), or rows of JSONL, Parquet or a saved Hugging Face dataset
(`dataset`, with its columns named in `task.columns`). Each kind reads only its own keys: a key of
another kind is an error naming the kind it belongs to.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from rlsched.config_load import Section
from verifiers.protocol import RewardRange


class TaskKind(StrEnum):
    ADDITION = "addition"  # the shipped toy task (rlsched/rl/task.py)
    JSONL = "jsonl"  # your own prompts and references, one JSON object per line (task.path)
    DATASET = "dataset"  # rows of JSONL, Parquet or a saved Hugging Face dataset (rlsched/rl/datasets.py)
    ARITHMETIC = "arithmetic"  # generated word problems for the `math` verifier (rlsched/rl/word_problems.py)


class TaskFormat(StrEnum):
    AUTO = "auto"  # from the path: *.jsonl, *.parquet, a save_to_disk directory, a directory of shards
    JSONL = "jsonl"
    PARQUET = "parquet"  # one file, or a directory of shards
    HF_DISK = "hf_disk"  # a directory written by Dataset.save_to_disk or DatasetDict.save_to_disk


class ArithmeticLevel(StrEnum):
    STARTER = "starter"  # addition and subtraction of numbers up to 20, one step, the number only
    EASY = "easy"  # two-digit addition and subtraction, one step
    MEDIUM = "medium"  # up to three digits, and a one-digit times a two-digit number; one step
    HARD = "hard"  # medium's problems and two-step ones


class TaskColumns(Section):
    """Which column of a dataset plays which part. Unset optional columns are used when the data has
    a column of their own name (`id`, `verifier`); a column named here must exist."""

    prompt: str | None = Field(None, description="the user message; unset: 'prompt' (unless messages is set)")
    messages: str | None = Field(None, description="a conversation to continue: [{role, content}, ...]")
    reference: str = Field("reference", description="the reference answer the verifier judges against")
    verifier: str | None = Field(None, description="each row's verifier kind; unset: 'verifier' if present")
    id: str | None = Field(None, description="each row's id; unset: 'id' if present, else its position")
    split: str | None = Field(None, description="a column naming each row's split (with task.eval_split)")

    @model_validator(mode="after")
    def _one_prompt(self) -> TaskColumns:
        if self.prompt is not None and self.messages is not None:
            raise ValueError("give one of prompt and messages, not both")
        return self

    @property
    def prompt_column(self) -> str | None:
        """The prompt column in use: None when the prompt is a messages column."""
        return None if self.messages is not None else (self.prompt or "prompt")


# which TaskConfig keys each kind reads; a key set for another kind is refused, not ignored
_TASK_KEYS: dict[TaskKind, frozenset[str]] = {
    TaskKind.ADDITION: frozenset({"digits"}),
    TaskKind.JSONL: frozenset({"path"}),
    TaskKind.DATASET: frozenset({"path", "format", "columns", "train_split", "eval_split"}),
    TaskKind.ARITHMETIC: frozenset({"level", "train_size"}),
}


def _keys_for_other_kinds(name: TaskKind, given: dict[str, Any]) -> str | None:
    """What is wrong when a task key meant for another kind is given a value (it would be ignored).
    A key at its default is let through, so that a dumped config loads again."""
    foreign = sorted(
        k
        for k, value in given.items()
        if k not in _TASK_KEYS[name]
        and any(k in keys for keys in _TASK_KEYS.values())
        and value != TaskConfig.model_fields[k].default
    )
    if not foreign:
        return None
    owners = {k: " or ".join(f"'{kind}'" for kind, keys in _TASK_KEYS.items() if k in keys) for k in foreign}
    shown = "; ".join(f"task.{k} is only for task.name {owners[k]}" for k in foreign)
    return f"{shown}; remove it or change task.name (now '{name}')"


class TaskConfig(Section):
    name: TaskKind = Field(
        TaskKind.ADDITION,
        description="the task: addition, word_problems, arithmetic, jsonl (task.path) or dataset "
        "(a local HF dataset at task.path)",
    )
    path: Path | None = Field(None, description="a jsonl task's file; a dataset task's file or directory")
    format: TaskFormat = Field(TaskFormat.AUTO, description="dataset only: how to read task.path")
    columns: TaskColumns = Field(TaskColumns(), description="dataset only: the column of each part")
    train_split: str = Field("train", description="dataset only: the split trained on, where it has splits")
    eval_split: str | None = Field(
        None, description="dataset only: the split held out; unset: eval_size rows drawn with task.seed"
    )
    digits: int = Field(3, ge=1, le=6, description="addition: digits per operand")
    level: ArithmeticLevel = Field(ArithmeticLevel.EASY, description="arithmetic only: how hard")
    train_size: int = Field(2048, ge=1, description="arithmetic only: distinct training problems")
    eval_size: int = Field(1024, ge=1, description="held-out problems in each evaluation")
    seed: int = Field(1234, description="seed of the task's problem draws (train and held-out sets)")
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0),
        description="the rewards its verifier may give, [low, high]: any other (or a non-finite one) "
        "never reaches training (a verifier's is a fault, an endpoint client's a 4xx)",
    )

    def rewards(self) -> RewardRange:
        return RewardRange(*self.reward_range)

    @field_validator("reward_range")
    @classmethod
    def _range(cls, value: tuple[float, float]) -> tuple[float, float]:
        RewardRange(*value)  # raises ValueError naming the rule
        return value

    @model_validator(mode="after")
    def _keys_match_kind(self) -> TaskConfig:
        if self.name in (TaskKind.JSONL, TaskKind.DATASET) and self.path is None:
            raise ValueError(f"task.path is required when task.name is '{self.name}'")
        given = {k: getattr(self, k) for k in self.model_fields_set}
        if (misplaced := _keys_for_other_kinds(self.name, given)) is not None:
            raise ValueError(misplaced)
        if self.eval_split == self.train_split:
            raise ValueError(
                f"task.eval_split and task.train_split are both {self.train_split!r}: the held-out rows "
                "would be trained on; name another split"
            )
        if self.columns.split is not None and self.eval_split is None:
            raise ValueError(
                f"task.columns.split ({self.columns.split!r}) needs task.eval_split: the value that "
                "marks held-out rows (rows marked task.train_split are trained on)"
            )
        return self

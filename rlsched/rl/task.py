"""The toy verifiable task: add two n-digit numbers, answer written least-significant digit first.

Why this task. Reward should teach what more supervised steps would not. The shipped base model is
pretrained on a *noisy teacher*: on each problem with a carry, the teacher forgets every carry with
probability `carry_drop` (0.6), a systematic mistake rather than random noise. A model that imitates
the teacher perfectly has plateaued: more supervised steps only fit the teacher better. Greedy
decoding follows the teacher's majority and drops the carry, so little more than the carry-free
problems pass (13% of 3-digit problems have no carry; the shipped base passes 16.1% of the held-out
set and 3.0% of its carry problems), while sampling still writes the correct carries on part of the
carry problems (about 17% for the shipped base). That is exactly what group-relative advantages
reinforce.

Answers are reversed (least-significant digit first) because that order lets a small decoder compute
each carry before it writes the next digit; the verifier knows the format.

Prompts are split deterministically: `eval_size` held-out problems drawn with the task seed, and
training problems drawn from the rest.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from rlsched.errors import UserError
from rlsched.model.template import Message, PromptFormat
from rlsched.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def content(self) -> str:
        return f"{self.a}+{self.b}"

    @property
    def answer(self) -> str:
        """The reference answer: the sum's digits, least significant first."""
        return str(self.a + self.b)[::-1]

    @property
    def verifier(self) -> str | None:
        return None  # the job's verifier judges every addition problem

    def has_carry(self) -> bool:
        return self.teacher_without_carry() != self.answer

    def teacher_without_carry(self) -> str:
        """The teacher's mistake: digit-wise sums mod 10, every carry forgotten."""
        xs, ys = str(self.a)[::-1], str(self.b)[::-1]
        width = max(len(xs), len(ys))
        xs, ys = xs.ljust(width, "0"), ys.ljust(width, "0")
        return "".join(str((int(x) + int(y)) % 10) for x, y in zip(xs, ys, strict=True))

    def messages(self) -> list[Message]:
        return [Message(role="user", content=self.content)]

    def prompt(self, template: PromptFormat) -> str:
        return template.render(self.messages())


class AdditionTask:
    """Problems with fixed-width operands in [10^(d-1), 10^d), split into train and held-out eval."""

    def __init__(self, digits: int = 3, eval_size: int = 1024, seed: int = 1234) -> None:
        if digits < 1:
            raise ValueError("digits must be >= 1")
        self.digits = digits
        self.low, self.high = 10 ** (digits - 1), 10**digits - 1
        space = (self.high - self.low + 1) ** 2
        if eval_size > space // 4:
            raise ValueError(f"eval_size {eval_size} is too large for {digits}-digit problems")
        rng = random.Random(seed)
        held: set[Problem] = set()
        while len(held) < eval_size:
            held.add(self._draw(rng))
        self.eval_problems: tuple[Problem, ...] = tuple(sorted(held, key=lambda p: (p.a, p.b)))
        self._held = held

    def _draw(self, rng: random.Random) -> Problem:
        return Problem(rng.randint(self.low, self.high), rng.randint(self.low, self.high))

    def train_problems(self, rng: random.Random) -> Iterator[Problem]:
        """An endless stream of training problems, never one of the held-out set."""
        while True:
            p = self._draw(rng)
            if p not in self._held:
                yield p

    def is_held_out(self, p: Problem) -> bool:
        return p in self._held


def teacher_answer(problem: Problem, rng: random.Random, carry_drop: float) -> str:
    """What the noisy teacher writes: the right answer, or with probability `carry_drop` no carries."""
    return problem.teacher_without_carry() if rng.random() < carry_drop else problem.answer


# -- a researcher's own task ---------------------------------------------------------------------


class TaskLine(BaseModel):
    """One line of a JSONL task file."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str | None = None
    prompt: str | None = None  # the user message, or
    messages: tuple[Message, ...] | None = None  # a whole conversation to continue
    reference: str
    verifier: str | None = None  # this sample's verifier kind, if not the job's
    split: Literal["train", "eval"] | None = None

    @field_validator("prompt", "reference", "messages")
    @classmethod
    def _not_empty(cls, value: str | tuple[Message, ...] | None) -> str | tuple[Message, ...] | None:
        if value is not None and not (value.strip() if isinstance(value, str) else value):
            raise ValueError("is empty; give it a value or remove the line")
        return value

    @model_validator(mode="after")
    def _one_prompt(self) -> TaskLine:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' and 'messages'")
        return self


@dataclass(frozen=True)
class JsonlProblem:
    """A problem given as a conversation and a reference: a JSONL line, a dataset row
    (rlsched/rl/datasets.py) or a generated word problem (rlsched/rl/word_problems.py)."""

    id: str
    conversation: tuple[Message, ...]
    answer: str
    verifier: str | None = None

    def messages(self) -> list[Message]:
        return list(self.conversation)

    def prompt(self, template: PromptFormat) -> str:
        return template.render(self.conversation)

    def has_carry(self) -> bool:
        return False  # the addition task's diagnostic; meaningless here


def _read_lines(path: Path) -> list[tuple[str | None, JsonlProblem]]:
    if not path.is_file():
        raise UserError(f"task file {path} does not exist")
    problems: list[tuple[str | None, JsonlProblem]] = []
    errors: list[str] = []
    for n, raw in enumerate(path.read_text().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = TaskLine.model_validate_json(raw)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "line"
            errors.append(f"line {n}: {where}: {first['msg'].removeprefix('Value error, ')}")
            continue
        convo = line.messages or (Message(role="user", content=line.prompt or ""),)
        problems.append(
            (line.split, JsonlProblem(line.id or f"line-{n}", convo, line.reference, line.verifier))
        )
    if errors:
        shown = "; ".join(errors[:5]) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise UserError(
            f"task file {path} has {len(errors)} bad line(s): {shown}. Each line is a JSON object "
            'like {"prompt": "...", "reference": "..."} (optional: id, messages, verifier, split)'
        )
    return problems


class JsonlTask:
    """Prompts with references from a JSONL file; `split` fields decide the held-out set, else a seeded
    draw of `eval_size` lines."""

    def __init__(self, path: Path, eval_size: int, seed: int) -> None:
        rows = _read_lines(path)
        if any(split is not None for split, _ in rows):
            held = [p for split, p in rows if split == "eval"]
            train = [p for split, p in rows if split != "eval"]
        else:
            shuffled = [p for _, p in rows]
            random.Random(seed).shuffle(shuffled)
            held, train = shuffled[:eval_size], shuffled[eval_size:]
        if not held or not train:
            raise UserError(
                f"task file {path} needs both training and held-out lines: it has {len(rows)} "
                f'lines; lower task.eval_size ({eval_size}) or mark lines with "split"'
            )
        self.eval_problems: tuple[JsonlProblem, ...] = tuple(held)
        self.train: tuple[JsonlProblem, ...] = tuple(train)

    def train_problems(self, rng: random.Random) -> Iterator[JsonlProblem]:
        while True:
            yield rng.choice(self.train)


TaskProblem = Problem | JsonlProblem


# -- checks every task shares ----------------------------------------------------------------------


def verify_kind_key(problem: TaskProblem, default_kind: str) -> tuple[str, str]:
    """The verifier kind of a problem's samples, and the key whose history predicts their
    verification time (and sets their timeout): the problem itself."""
    if isinstance(problem, JsonlProblem):
        return problem.verifier or default_kind, problem.id
    return default_kind, problem.content


def name_rows(rows: Sequence[str], shown: int = 5) -> str:
    """The first few of a list of rows, and how many there are: never a wall of text, never silent."""
    if len(rows) <= shown:
        return ", ".join(rows)
    return f"{', '.join(rows[:shown])} and {len(rows) - shown} more ({len(rows)} in all)"


def problem_name(problem: TaskProblem) -> str:
    """How a problem is named to the user: its id, or the addition problem itself."""
    return problem.id if isinstance(problem, JsonlProblem) else problem.content


@dataclass(frozen=True)
class PromptRoom:
    """How a task's prompts fit the model's context: an answer, not a refusal."""

    rows: int
    longest: int  # tokens of the longest prompt
    context_length: int
    max_tokens: int
    cramped: int  # prompts leaving less than max_tokens of room: their generations stop at the context

    def note(self) -> str | None:
        """A line for the user when some generations will be cut short by the context, else None."""
        if not self.cramped:
            return None
        return (
            f"{self.cramped} of {self.rows} prompts leave less than sampling.max_tokens ({self.max_tokens}) "
            f"of the {self.context_length}-token context (the longest has {self.longest} tokens); their "
            "generations stop at the context. Lower sampling.max_tokens or shorten those prompts"
        )


def check_prompt_lengths(
    problems: Sequence[TaskProblem],
    count_tokens: Callable[[TaskProblem], int],
    context_length: int,
    max_tokens: int,
    source: str,
) -> PromptRoom:
    """Refuse prompts that leave no room for even one generated token in `context_length`, naming
    them; return how the rest fit (prompts leaving less than `max_tokens` are counted, not refused)."""
    lengths = [count_tokens(p) for p in problems]
    too_long = [
        f"{problem_name(p)} ({n} tokens)"
        for p, n in zip(problems, lengths, strict=True)
        if n >= context_length
    ]
    if too_long:
        raise UserError(
            f"{source}: {len(too_long)} prompt(s) fill the model's {context_length}-token context, leaving "
            f"no room to generate: {name_rows(too_long)}. Shorten or filter those prompts, or pick a "
            "model with a longer context (lowering sampling.max_tokens cannot make room)"
        )
    cramped = sum(1 for n in lengths if n + max_tokens > context_length)
    return PromptRoom(len(lengths), max(lengths, default=0), context_length, max_tokens, cramped)


def finite_problems(task: AdditionTask | JsonlTask | Any) -> list[TaskProblem]:
    """Every prompt a task can send: its held-out and training problems (the addition task's stream
    is endless and its prompts all alike, so its held-out set stands for it)."""
    return [*task.eval_problems, *getattr(task, "train", ())]


def check_prompts(
    task: AdditionTask | JsonlTask | Any,
    tokenizer: Tokenizer,
    template: PromptFormat,
    context_length: int,
    max_tokens: int,
    source: str,
) -> PromptRoom:
    """`check_prompt_lengths` over a task's prompts as the job renders and tokenizes them."""
    problems = finite_problems(task)
    counts = dict(
        zip(
            map(id, problems),
            map(len, tokenizer.encode_batch([template.render(p.messages()) for p in problems])),
            strict=True,
        )
    )
    return check_prompt_lengths(problems, lambda p: counts[id(p)], context_length, max_tokens, source)

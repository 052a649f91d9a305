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
from collections.abc import Iterator
from dataclasses import dataclass

from rlsched.model.template import ConvTemplate, Message


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

    def prompt(self, template: ConvTemplate) -> str:
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

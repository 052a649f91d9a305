"""Generated arithmetic word problems for real instruct models, judged by the `math` verifier.

"Sam has 17 apples and buys 25 more. How many apples does Sam have now? Put the final answer in
\\boxed{}." The toy `addition` task speaks to the shipped byte-level model; a small Hugging Face
instruct model (SmolLM2-135M-Instruct writes "17 + 25 = 32") needs plain English, and a problem it can
reach: the `starter` level is one step of addition or subtraction of numbers up to 20, asking for the
number only, where such a model is right often enough (about a quarter of the time, greedily) for
group-relative advantages to have something to reinforce; `easy` is the same with two-digit numbers.
`medium` adds three-digit numbers and a one-digit times a two-digit number; `hard` adds two-step
problems.

The prompt asks for `\\boxed{}` (the convention of math RL datasets and of the `math_strict` kind),
except at `starter`, which asks for the number alone (on single-digit problems SmolLM2-135M answered
43% of them that way and 26% when asked for the box);
the `math` verifier also accepts the last number of the text, so a model that ignores the box is
still judged on its arithmetic. References are bare numbers; every problem names verifier `math`.

Determinism and the split. One `random.Random(seed)` draws the held-out problems first, then the
training problems, each distinct. A problem's identity is its arithmetic, not its wording: the
operation and its operands (in sorted order where the order does not matter, 17+25 = 25+17), which
is also its id (`add-17-25`). So a held-out sum never reaches training dressed in another template
or name. The held-out set depends only on the seed, the level and `eval_size`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rlsched.config_task import ArithmeticLevel
from rlsched.errors import UserError
from rlsched.model.template import Message
from rlsched.rl.task import JsonlProblem

ANSWER_FORMAT = "Put the final answer in \\boxed{}."
VERIFIER = "math"

NAMES = ("Sam", "Mia", "Leo", "Ana", "Ben", "Zoe", "Max", "Ivy", "Tom", "Eva", "Raj", "Lin")
ITEMS = ("apples", "pencils", "marbles", "stickers", "books", "cookies", "shells", "stamps", "cards")

Operands = tuple[int, ...]


@dataclass(frozen=True)
class Operation:
    """One kind of problem: how to draw its operands, its answer, and the sentences that ask it."""

    name: str
    draw: Callable[[random.Random, int], Operands]  # (rng, largest operand) -> operands
    answer: Callable[[Operands], int]
    identity: Callable[[Operands], Operands]  # the operands in a canonical order
    templates: tuple[str, ...]


def _draw_add(rng: random.Random, high: int) -> Operands:
    return rng.randint(10, high), rng.randint(10, high)


def _draw_sub(rng: random.Random, high: int) -> Operands:
    a = rng.randint(11, high)
    return a, rng.randint(10, a - 1)


def _draw_mul(rng: random.Random, high: int) -> Operands:
    return rng.randint(2, 9), rng.randint(10, min(high, 99))


def _draw_add_sub(rng: random.Random, high: int) -> Operands:
    a, b = _draw_add(rng, high)
    return a, b, rng.randint(10, a + b - 1)


def _draw_mul_add(rng: random.Random, high: int) -> Operands:
    return (*_draw_mul(rng, high), rng.randint(10, high))


def _draw_sub_sub(rng: random.Random, high: int) -> Operands:
    a = rng.randint(30, high)
    b = rng.randint(10, a - 20)
    return a, b, rng.randint(10, a - b - 1)


def _as_drawn(ops: Operands) -> Operands:
    return ops


def _sorted_pair(ops: Operands) -> Operands:
    return (*sorted(ops[:2]), *ops[2:])


def _sorted_tail(ops: Operands) -> Operands:
    return (ops[0], *sorted(ops[1:]))


ADD = Operation(
    "add",
    _draw_add,
    lambda o: o[0] + o[1],
    _sorted_pair,
    (
        "{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?",
        "There are {a} {item} in a box. {name} puts in {b} more. How many {item} are in the box now?",
        "{name} collected {a} {item} on Monday and {b} {item} on Tuesday. How many {item} did {name} "
        "collect in all?",
    ),
)
SUB = Operation(
    "sub",
    _draw_sub,
    lambda o: o[0] - o[1],
    _as_drawn,
    (
        "{name} has {a} {item} and gives {b} of them to a friend. How many {item} does {name} have left?",
        "There are {a} {item} on a shelf. {name} takes {b} of them. How many {item} are left on the shelf?",
        "{name} had {a} {item} and lost {b} of them. How many {item} does {name} have now?",
    ),
)
MUL = Operation(
    "mul",
    _draw_mul,
    lambda o: o[0] * o[1],
    _as_drawn,
    (
        "{name} buys {a} boxes with {b} {item} in each box. How many {item} does {name} buy in all?",
        "There are {a} rows of {item} with {b} {item} in each row. How many {item} are there in all?",
        "{name} gets {b} {item} every day for {a} days. How many {item} does {name} get in all?",
    ),
)
ADD_SUB = Operation(
    "add_sub",
    _draw_add_sub,
    lambda o: o[0] + o[1] - o[2],
    _sorted_pair,
    (
        "{name} has {a} {item}, buys {b} more, and then gives {c} to a friend. How many {item} does "
        "{name} have now?",
        "There are {a} {item} in a box. {name} adds {b} more and then takes out {c}. How many {item} "
        "are in the box now?",
    ),
)
MUL_ADD = Operation(
    "mul_add",
    _draw_mul_add,
    lambda o: o[0] * o[1] + o[2],
    _as_drawn,
    (
        "{name} buys {a} boxes with {b} {item} in each box and already had {c} {item}. How many "
        "{item} does {name} have now?",
    ),
)
SUB_SUB = Operation(
    "sub_sub",
    _draw_sub_sub,
    lambda o: o[0] - o[1] - o[2],
    _sorted_tail,
    ("{name} has {a} {item}, gives {b} to a friend and loses {c}. How many {item} does {name} have left?",),
)


def _draw_small_add(rng: random.Random, high: int) -> Operands:
    return rng.randint(1, high), rng.randint(1, high)


def _draw_small_sub(rng: random.Random, high: int) -> Operands:
    a = rng.randint(2, high)
    return a, rng.randint(1, a - 1)


# the same problems with operands from 1: a 135M model's reach (SmolLM2-135M-Instruct answers about
# a quarter of them greedily, against under a tenth of the two-digit ones)
SMALL_ADD = Operation("add", _draw_small_add, ADD.answer, ADD.identity, ADD.templates)
SMALL_SUB = Operation("sub", _draw_small_sub, SUB.answer, SUB.identity, SUB.templates)


@dataclass(frozen=True)
class Level:
    name: str
    high: int  # the largest operand of an addition or subtraction
    operations: tuple[Operation, ...]
    instruction: str = ANSWER_FORMAT  # how the prompt asks for the answer


LEVELS: dict[ArithmeticLevel, Level] = {
    ArithmeticLevel.STARTER: Level("starter", 20, (SMALL_ADD, SMALL_SUB), "Answer with the number only."),
    ArithmeticLevel.EASY: Level("easy", 99, (ADD, SUB)),
    ArithmeticLevel.MEDIUM: Level("medium", 999, (ADD, SUB, MUL)),
    ArithmeticLevel.HARD: Level("hard", 999, (ADD, SUB, MUL, ADD_SUB, MUL_ADD, SUB_SUB)),
}


def problem_id(op: Operation, operands: Operands) -> str:
    """The problem's identity: its operation and canonical operands (`add-17-25`)."""
    return "-".join((op.name, *map(str, op.identity(operands))))


def draw_problem(rng: random.Random, level: Level) -> JsonlProblem:
    """One problem of the level: an operation, its operands, a template, a name and an item."""
    op = rng.choice(level.operations)
    operands = op.draw(rng, level.high)
    template = rng.choice(op.templates)
    slots = dict(zip("abc", map(str, operands), strict=False))
    question = template.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), **slots)
    message = Message(role="user", content=f"{question} {level.instruction}")
    return JsonlProblem(problem_id(op, operands), (message,), str(op.answer(operands)), VERIFIER)


def draw_distinct(rng: random.Random, level: Level, count: int, taken: set[str]) -> list[JsonlProblem]:
    """`count` problems whose ids are not in `taken` (which grows); refused if the level runs out."""
    drawn: list[JsonlProblem] = []
    attempts = 0
    while len(drawn) < count:
        attempts += 1
        if attempts > 20 * count + 1000:
            raise UserError(
                f"arithmetic level '{level.name}' ran short of distinct problems: {len(taken)} drawn, "
                f"{count - len(drawn)} more wanted; lower task.train_size or task.eval_size, or pick a "
                "level with more problems (task.level: medium or hard)"
            )
        problem = draw_problem(rng, level)
        if problem.id not in taken:
            taken.add(problem.id)
            drawn.append(problem)
    return drawn


class ArithmeticTask:
    """`eval_size` held-out word problems and `train_size` distinct training ones, never the same."""

    def __init__(
        self,
        level: ArithmeticLevel = ArithmeticLevel.EASY,
        train_size: int = 2048,
        eval_size: int = 1024,
        seed: int = 1234,
    ) -> None:
        rng = random.Random(seed)
        taken: set[str] = set()
        self.level = level
        self.eval_problems: tuple[JsonlProblem, ...] = tuple(
            draw_distinct(rng, LEVELS[level], eval_size, taken)
        )
        self._held = frozenset(taken)
        self.train: tuple[JsonlProblem, ...] = tuple(draw_distinct(rng, LEVELS[level], train_size, taken))

    def train_problems(self, rng: random.Random) -> Iterator[JsonlProblem]:
        """An endless stream drawn from the training problems, never a held-out one."""
        while True:
            yield rng.choice(self.train)

    def is_held_out(self, problem: JsonlProblem) -> bool:
        return problem.id in self._held


_EXPRESSIONS = {
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "add_sub": "{0} + {1} - {2}",
    "mul_add": "{0} * {1} + {2}",
    "sub_sub": "{0} - {1} - {2}",
}


def expression_of(problem_id: str) -> str:
    """The arithmetic a problem asks, from its id (`add-17-25` -> `17 + 25`): what a teacher writes
    into a calculator call (`rlsched.rl.tool_warmup`)."""
    name, *operands = problem_id.split("-")
    if name not in _EXPRESSIONS:
        raise ValueError(f"{problem_id!r} is not the id of a generated arithmetic problem")
    return _EXPRESSIONS[name].format(*operands)

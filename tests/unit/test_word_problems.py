"""Generated arithmetic word problems: deterministic for a seed, held-out never trained on, in reach."""

from __future__ import annotations

import random
import re

import pytest

from rlsched.config import load_config
from rlsched.config_task import ArithmeticLevel
from rlsched.errors import UserError
from rlsched.rl.tasks import build_task
from rlsched.rl.word_problems import ANSWER_FORMAT, LEVELS, ArithmeticTask, problem_id
from verifiers.math import MathVerifier
from verifiers.protocol import Verdict, VerifyRequest


def test_same_seed_same_problems_and_another_seed_others() -> None:
    a, b = ArithmeticTask(seed=7), ArithmeticTask(seed=7)
    assert a.eval_problems == b.eval_problems and a.train == b.train
    assert ArithmeticTask(seed=8).eval_problems != a.eval_problems


def test_held_out_set_does_not_depend_on_the_training_size() -> None:
    assert (
        ArithmeticTask(train_size=10, seed=3).eval_problems
        == ArithmeticTask(train_size=500, seed=3).eval_problems
    )


@pytest.mark.parametrize("level", list(ArithmeticLevel))
def test_held_out_problems_never_reach_training(level: ArithmeticLevel) -> None:
    train, held_n = (250, 100) if level is ArithmeticLevel.STARTER else (1500, 500)  # starter has 400
    task = ArithmeticTask(level, train_size=train, eval_size=held_n, seed=1)
    held = {p.id for p in task.eval_problems}
    assert len(held) == held_n and len({p.id for p in task.train}) == train
    assert not held & {p.id for p in task.train}
    stream = task.train_problems(random.Random(0))
    assert not any(task.is_held_out(next(stream)) for _ in range(3000))


def test_identity_is_the_arithmetic_not_the_wording() -> None:
    add = LEVELS[ArithmeticLevel.EASY].operations[0]
    assert problem_id(add, (17, 25)) == problem_id(add, (25, 17)) == "add-17-25"


def answer_of(problem_id: str) -> int:
    """Recompute a problem's answer from its id, independently of the generator's lambdas."""
    op, *rest = problem_id.split("-")
    x = list(map(int, rest))
    return {
        "add": lambda: x[0] + x[1],
        "sub": lambda: x[0] - x[1],
        "mul": lambda: x[0] * x[1],
        "add_sub": lambda: x[0] + x[1] - x[2],
        "mul_add": lambda: x[0] * x[1] + x[2],
        "sub_sub": lambda: x[0] - x[1] - x[2],
    }[op]()


@pytest.mark.parametrize("level", list(ArithmeticLevel))
def test_problems_are_plain_english_with_positive_bare_answers(level: ArithmeticLevel) -> None:
    task = ArithmeticTask(level, train_size=200, eval_size=100, seed=2)
    ask = LEVELS[level].instruction
    assert ask == ("Answer with the number only." if level is ArithmeticLevel.STARTER else ANSWER_FORMAT)
    for p in (*task.eval_problems, *task.train):
        (message,) = p.messages()
        assert message.role == "user" and message.content.endswith(ask)
        assert "{" not in message.content.removesuffix(ask)  # every slot filled
        assert p.verifier == "math" and not p.has_carry()
        assert p.answer == str(answer_of(p.id)) and int(p.answer) > 0
        operands = re.findall(r"\d+", message.content)
        assert sorted(operands) == sorted(p.id.split("-")[1:])  # the question states its operands


def test_easy_is_one_step_of_two_digit_addition_or_subtraction() -> None:
    task = ArithmeticTask(ArithmeticLevel.EASY, train_size=2000, eval_size=1000, seed=0)
    ops = {p.id.split("-")[0] for p in task.train}
    assert ops == {"add", "sub"}
    assert all(10 <= int(n) <= 99 for p in task.train for n in p.id.split("-")[1:])
    hard = ArithmeticTask(ArithmeticLevel.HARD, train_size=2000, eval_size=100, seed=0)
    assert {"add_sub", "mul_add", "sub_sub"} <= {p.id.split("-")[0] for p in hard.train}


def test_the_math_verifier_accepts_the_asked_form_and_the_last_number() -> None:
    verifier = MathVerifier()
    for p in ArithmeticTask(train_size=20, eval_size=20, seed=4).eval_problems:
        for text in (f"\\boxed{{{p.answer}}}", f"So the answer is {p.answer}.", "\\boxed{0}"):
            out = verifier.verify(VerifyRequest(p.id, text, p.answer))
            assert isinstance(out, Verdict) and out.correct is (text != "\\boxed{0}")


def test_a_level_too_small_for_the_sizes_is_refused() -> None:
    with pytest.raises(UserError, match=r"arithmetic level 'easy' ran short.*task\.train_size"):
        ArithmeticTask(ArithmeticLevel.EASY, train_size=8100, eval_size=100, seed=0)


def test_config_builds_it_and_refuses_keys_of_other_tasks() -> None:
    cfg = load_config(
        None,
        [
            "task.name=arithmetic",
            "task.level=medium",
            "task.train_size=64",
            "task.eval_size=32",
            "eval.curve_size=16",
        ],
    )
    task = build_task(cfg.task)
    assert isinstance(task, ArithmeticTask) and task.level is ArithmeticLevel.MEDIUM
    assert len(task.eval_problems) == 32 and len(task.train) == 64
    with pytest.raises(UserError, match=r"task\.digits is only for task\.name 'addition'"):
        load_config(None, ["task.name=arithmetic", "task.digits=2"])
    with pytest.raises(UserError, match=r"task\.level is only for task\.name 'arithmetic'"):
        load_config(None, ["task.level=hard"])
    with pytest.raises(
        UserError, match=r"task\.level: Input should be 'starter', 'easy', 'medium' or 'hard'"
    ):
        load_config(None, ["task.name=arithmetic", "task.level=trivial"])

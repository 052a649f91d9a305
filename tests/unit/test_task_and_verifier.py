"""The toy task (references, carries, split) and the verifier's two kinds of outcome."""

from __future__ import annotations

import random

from rlsched.rl.task import AdditionTask, Problem, teacher_answer
from verifiers.exact_answer import ExactAnswerVerifier
from verifiers.protocol import ExecutionFault, FaultKind, Verdict, VerifyRequest, run_verifier


def test_reference_is_reversed_sum() -> None:
    assert Problem(123, 456).answer == "975"
    assert Problem(999, 999).answer == "8991"


def test_teacher_mistake_forgets_every_carry() -> None:
    assert Problem(123, 456).teacher_without_carry() == "975"  # no carry: the same answer
    assert not Problem(123, 456).has_carry()
    assert Problem(158, 275).teacher_without_carry() == "323"  # 8+5=13 -> 3, 5+7=12 -> 2, 1+2 -> 3
    assert Problem(158, 275).answer == "334"
    assert Problem(500, 600).has_carry()  # the final carry is a carry too


def test_teacher_noise_rate() -> None:
    rng = random.Random(0)
    p = Problem(158, 275)
    wrong = sum(teacher_answer(p, rng, 0.6) != p.answer for _ in range(5000))
    assert 0.57 < wrong / 5000 < 0.63


def test_eval_split_is_deterministic_and_held_out() -> None:
    a, b = AdditionTask(eval_size=1000, seed=5), AdditionTask(eval_size=1000, seed=5)
    assert a.eval_problems == b.eval_problems and len(a.eval_problems) == 1000
    stream = a.train_problems(random.Random(0))
    assert not any(a.is_held_out(next(stream)) for _ in range(20000))


def test_verdicts_are_rewards() -> None:
    v = ExactAnswerVerifier()
    assert v.verify(VerifyRequest("s", " 975 ", "975")) == Verdict("s", 1.0, True)
    wrong = v.verify(VerifyRequest("s", "579", "975"))
    assert isinstance(wrong, Verdict) and wrong.reward == 0.0 and not wrong.correct
    empty = v.verify(VerifyRequest("s", "", "975"))
    assert isinstance(empty, Verdict) and empty.reward == 0.0


class _Crashing:
    name = "crashing"

    def verify(self, request: VerifyRequest) -> Verdict:
        raise RuntimeError("sandbox exploded")


class _Hungry:
    name = "hungry"

    def verify(self, request: VerifyRequest) -> Verdict:
        raise MemoryError


def test_a_crash_is_an_execution_fault_never_a_zero_reward() -> None:
    out = run_verifier(_Crashing(), VerifyRequest("s", "975", "975", attempt=1))
    assert isinstance(out, ExecutionFault) and out.kind is FaultKind.CRASH and out.attempt == 1
    assert "sandbox exploded" in out.detail
    out = run_verifier(_Hungry(), VerifyRequest("s", "975", "975"))
    assert isinstance(out, ExecutionFault) and out.kind is FaultKind.RESOURCES
    bad_input = run_verifier(ExactAnswerVerifier(), VerifyRequest("s", None, "1"))  # type: ignore[arg-type]
    assert isinstance(bad_input, ExecutionFault)

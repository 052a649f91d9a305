"""The math verifier: final-answer extraction, numeric comparison, format reward, faults on bad data."""

from __future__ import annotations

from fractions import Fraction

import pytest

from verifiers.loading import load_verifier
from verifiers.math import MathVerifier, find_answer, last_boxed, numbers_in, reference_number
from verifiers.protocol import ExecutionFault, FaultKind, Verdict, VerifyRequest, run_verifier


def judge(text: str, reference: str, verifier: MathVerifier | None = None) -> Verdict:
    out = (verifier or MathVerifier()).verify(VerifyRequest("s", text, reference))
    assert isinstance(out, Verdict), out
    return out


@pytest.mark.parametrize(
    ("text", "reference", "correct"),
    [
        ("42", "42", True),
        ("17 + 25 = 42.", "42", True),  # a full stop is not a decimal point
        ("17 + 25 = 32", "42", False),  # SmolLM2-135M's kind of mistake
        ("The answer is \\boxed{42}.", "42", True),
        ("\\boxed{41} no wait, \\boxed{42}", "42", True),  # the last box
        ("\\boxed{42} and later 7 apples", "42", True),  # a box beats the last number
        ("\\boxed{17 + 25 = 42}", "42", True),  # the last number inside the box
        ("\\boxed{\\frac{1}{2}}", "0.5", True),
        ("\\boxed{\\dfrac{3}{4}}", "\\boxed{\\frac{3}{4}}", True),
        ("\\boxed{\\text{about }{1{,}234}}", "1234", True),  # nested braces, LaTeX thousands
        ("so x = 3/4", "0.75", True),
        ("It costs $1,234.50 in all", "1234.5", True),
        ("#### 1,234", "1234", True),
        ("work...\n#### 72", "Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", True),  # GSM8K style
        ("The change is -8", "-8", True),
        ("25 - 33 = −8", "-8", True),  # a Unicode minus
        ("17-25", "-8", False),  # 25, not -25: a binary minus is not a sign
        ("x=-5", "-5", True),
        ("42%", "42", True),
        ("42%", "0.42", True),  # a percent read either way
        ("0.42", "42%", True),
        ("0.33333", "1/3", False),  # outside 1e-6 relative
        ("0.333333", "1/3", True),
        ("1000001", "1000000", False),  # integers must be equal
        ("3.0", "3", True),
        (".5", "0.5", True),
        ("I do not know", "42", False),  # no number: a wrong answer, not a fault
        ("", "42", False),
        ("\\boxed{abc}", "42", False),  # a boxed answer without a number is the answer given
        ("\\boxed{42", "42", True),  # a box cut off: the last number
    ],
)
def test_answers(text: str, reference: str, correct: bool) -> None:
    verdict = judge(text, reference)
    assert verdict.correct is correct, verdict.detail
    assert verdict.reward == (1.0 if correct else 0.0)


@pytest.mark.parametrize(
    ("text", "source", "value"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\boxed{}", Fraction(1, 2)),
        ("a #### 7 then 9", "####", Fraction(7)),
        ("1, 2, and 3", "last number", Fraction(3)),
        ("-\\frac{3}{4}", "last number", Fraction(-3, 4)),
        ("5/0 or 6", "last number", Fraction(6)),  # a zero denominator is no number
        ("nothing", "last number", None),
    ],
)
def test_what_is_extracted(text: str, source: str, value: Fraction | None) -> None:
    answer = find_answer(text)
    assert answer.source == source
    assert (answer.number.value if answer.number else None) == value


def test_last_boxed_balances_braces() -> None:
    assert last_boxed("\\boxed{a{b}c} \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} \\boxed{2") == "1"
    assert last_boxed("no box") is None
    assert [n.shown for n in numbers_in("1,234,567 and 12,34")] == ["1,234,567", "12", "34"]


@pytest.mark.parametrize(
    ("reference", "value"),
    [
        ("42", Fraction(42)),
        ("#### 42", Fraction(42)),
        (" 42.\n", Fraction(42)),
        ("$\\boxed{-1{,}000}$", Fraction(-1000)),
        ("x^2 + 1", None),  # not one number
        ("42 apples", None),
        ("no number", None),
        ("", None),
    ],
)
def test_reference_must_be_one_number(reference: str, value: Fraction | None) -> None:
    found = reference_number(reference)
    assert (found.value if found else None) == value


def test_a_reference_without_a_number_is_an_input_fault() -> None:
    out = MathVerifier().verify(VerifyRequest("s", "42", "forty-two"))
    assert isinstance(out, ExecutionFault) and out.kind is FaultKind.INPUT and not out.kind.retryable
    assert "forty-two" in out.detail
    blank = run_verifier(MathVerifier(), VerifyRequest("s", "42", " "))
    assert isinstance(blank, ExecutionFault) and blank.kind is FaultKind.INPUT


def test_detail_says_what_was_extracted() -> None:
    assert judge("so \\boxed{41}", "42").detail == "answer 41 (from \\boxed{}) differs from reference 42"
    assert judge("it is 42", "#### 42").detail == "answer 42 (from last number) matches reference 42"
    assert "no number" in judge("hmm", "42").detail


def test_format_reward_and_strict_kind() -> None:
    shaped = MathVerifier(format_reward=0.1)
    assert judge("\\boxed{41}", "42", shaped).reward == 0.1  # wrong, but in the asked form
    assert judge("41", "42", shaped).reward == 0.0
    assert judge("\\boxed{42}", "42", shaped).reward == 1.0
    strict = load_verifier("math_strict")
    assert isinstance(strict, MathVerifier) and strict.name == "math_strict"
    assert judge("17 + 25 = 42", "42", strict).reward == 0.0
    assert judge("#### 42", "42", strict).correct
    assert load_verifier("math").name == "math"
    with pytest.raises(ValueError, match="format_reward"):
        MathVerifier(format_reward=1.0)


# -- issue 41, finding 9: math that cannot be hedged ----------------------------------------------


def test_an_integer_reference_takes_only_that_integer() -> None:
    """`\\boxed{1000000000.5}` scored correct against 1000000007 under the relative tolerance."""
    verifier = MathVerifier()
    for hedge in ("\\boxed{1000000000.5}", "\\boxed{1000000007.0000001}", "\\boxed{1000000006.99}"):
        outcome = verifier.verify(VerifyRequest("s", hedge, "1000000007"))
        assert isinstance(outcome, Verdict) and not outcome.correct, hedge
    assert run_verifier(verifier, VerifyRequest("s", "\\boxed{1000000007.0}", "1000000007")).correct  # type: ignore[union-attr]
    assert run_verifier(verifier, VerifyRequest("s", "0.3333333", "1/3")).correct  # type: ignore[union-attr]
    strict = MathVerifier(rel_tol=Fraction(0))
    assert not run_verifier(strict, VerifyRequest("s", "0.3333333", "1/3")).correct  # type: ignore[union-attr]


def test_a_number_too_long_to_parse_is_a_wrong_answer_not_a_fault() -> None:
    """An answer of more than 4,300 digits became a retried CRASH fault, and its group was dropped."""
    huge = "9" * 5000
    for text in (f"\\boxed{{{huge}}}", f"the answer is 42, or {huge}", f"#### {huge}"):
        outcome = run_verifier(MathVerifier(), VerifyRequest("s", text, "42"))
        assert isinstance(outcome, Verdict) and outcome.reward == 0.0 and not outcome.correct, text
    bad_reference = run_verifier(MathVerifier(), VerifyRequest("s", "42", huge))
    assert isinstance(bad_reference, ExecutionFault) and bad_reference.kind is FaultKind.INPUT


def test_unclosed_boxes_cost_linear_time() -> None:
    """4,000 unclosed `\\boxed{` took 9.8 s (quadratic), against a 2 s timeout."""
    import time

    text = "\\boxed{" * 40_000 + " 42"
    start = time.perf_counter()
    outcome = run_verifier(MathVerifier(), VerifyRequest("s", text, "42"))
    assert time.perf_counter() - start < 1.0
    assert isinstance(outcome, Verdict) and outcome.correct  # no box closed: the last number counts
    assert last_boxed("\\boxed{1} \\boxed{2 \\boxed{3}") == "3" and last_boxed("\\boxed{{x}") is None

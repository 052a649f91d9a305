"""Math verifier: take the final number out of a free-text solution and compare it with the reference.

The answer is, in this order: the content of the last `\\boxed{...}` (nested braces handled), the
number after the last `####` (GSM8K style), else the last number anywhere in the text. Inside a box
the last number counts (`\\boxed{17 + 25 = 42}` answers 42). Numbers may carry a sign, thousands
commas (1,234), decimals, a simple fraction (3/4, `\\frac{3}{4}`) and a percent sign; a sentence's
full stop is not a decimal point ("= 42." is 42). An integer reference takes only that integer (so
1000000000.5 is not 1000000007); otherwise the values must agree within the task's relative
tolerance (`MathVerifier(rel_tol=...)`, 1e-6 unless stated). A percent may be read either way: "42%"
matches 42 and 0.42. A number of more than `MAX_DIGITS` digits is never parsed: as an answer it is
wrong, as a reference bad data. Finding the answer is linear in the text's length, however many
`\\boxed{` it leaves open.

The reference is stricter: one number, bare, after `####`, or in `\\boxed{}` (so a whole GSM8K
solution or a MATH-style boxed answer works). A reference that is not one number is bad data, an
INPUT fault, never a zero reward: guessing at it could score right answers wrong. An answer with no
number at all is the policy's doing: a wrong answer, reward 0.

Format. `MathVerifier(format_reward=r)` gives a wrong answer written in the asked form (`\\boxed{}`
or `####`) the reward r instead of 0; `require_format=True` (the `math_strict` kind) scores an answer
outside those forms 0 even when its last number is right. A right answer scores 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from verifiers.protocol import ExecutionFault, FaultKind, Outcome, Verdict, VerifyRequest

REL_TOL = Fraction(1, 10**6)
MAX_DIGITS = 1000  # longer numbers are not parsed (Python refuses past 4,300 digits anyway)

_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])(?P<sign>[-+]))?"  # a sign, unless it is a binary operator (17-5)
    r"(?<![\d.])(?P<value>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:/(?P<den>\d+))?"  # 3/4
    r"(?P<pct>\s?%)?"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([-+]?[\d.,]+)\s*\}\s*\{\s*([\d.,]+)\s*\}")
_LATEX_NOISE = (("{,}", ","), ("\\!", ""), ("\\,", ""), ("\\%", "%"), ("\\$", ""), ("$", ""), ("−", "-"))


@dataclass(frozen=True)
class Number:
    value: Fraction | None  # None: too long to parse (it matches nothing)
    percent: bool
    shown: str

    def readings(self) -> tuple[Fraction, ...]:
        """What the number may mean: a percent is its value or its value / 100."""
        if self.value is None:
            return ()
        return (self.value, self.value / 100) if self.percent else (self.value,)


@dataclass(frozen=True)
class Answer:
    """What was found in a text: the region the answer came from, and its number if it had one."""

    source: str  # "\\boxed{}", "####" or "last number"
    region: str
    number: Number | None

    @property
    def formatted(self) -> bool:
        return self.source != "last number"


def normalize(text: str) -> str:
    """LaTeX spellings of numbers as plain text: `\\frac{1}{2}` -> 1/2, `1{,}234` -> 1,234, `\\%` -> %."""
    for old, new in _LATEX_NOISE:
        text = text.replace(old, new)
    return _FRAC.sub(r"\1/\2", text)


def numbers_in(text: str) -> list[Number]:
    """Every number in a text, in order (a fraction with a zero denominator is none)."""
    found: list[Number] = []
    for m in _NUMBER.finditer(normalize(text)):
        if len(m["value"]) + len(m["den"] or "") > MAX_DIGITS:
            found.append(Number(None, False, m.group(0).strip()[:20] + "..."))
            continue
        value = Fraction(m["value"].replace(",", ""))
        if m["den"] is not None:
            if int(m["den"]) == 0:
                continue
            value /= int(m["den"])
        if m["sign"] == "-":
            value = -value
        found.append(Number(value, m["pct"] is not None, m.group(0).strip()))
    return found


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` (or `\\fbox{...}`), braces balanced; one pass
    over the text pairs every brace, so unclosed boxes cost nothing more."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    closes = _closing_braces(text)
    for start in reversed(starts):
        end = closes.get(start - 1)
        if end is not None:
            return text[start:end]
    return None  # only boxes cut off before they closed


def _closing_braces(text: str) -> dict[int, int]:
    """The position of each `{` that is closed, mapped to its `}`."""
    pairs: dict[int, int] = {}
    open_at: list[int] = []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            open_at.append(m.start())
        elif open_at:
            pairs[open_at.pop()] = m.start()
    return pairs


def find_answer(text: str) -> Answer:
    """The final answer of a free-text solution (see the module's docstring for the order)."""
    boxed = last_boxed(text)
    if boxed is not None:
        found = numbers_in(boxed)
        return Answer("\\boxed{}", boxed, found[-1] if found else None)
    if "####" in text:
        after = text.rsplit("####", 1)[1]
        found = numbers_in(after)
        return Answer("####", after.strip(), found[0] if found else None)
    found = numbers_in(text)
    return Answer("last number", text, found[-1] if found else None)


def reference_number(reference: str) -> Number | None:
    """The reference's one number, or None when it is not exactly one number."""
    answer = find_answer(reference)
    found = numbers_in(answer.region)
    if len(found) != 1:
        return None
    rest = normalize(answer.region).replace(found[0].shown, "", 1).strip()
    return found[0] if rest in ("", ".") else None


def same_number(answer: Number, reference: Number, rel_tol: Fraction = REL_TOL) -> bool:
    """The answer is the reference: exactly, when the reference reads as an integer; otherwise within
    a relative `rel_tol`. A percent (either side) may be read either way."""
    for x in answer.readings():
        for y in reference.readings():
            if y.denominator == 1:
                if x == y:
                    return True
            elif abs(x - y) <= rel_tol * max(abs(x), abs(y)):
                return True
    return False


class MathVerifier:
    """Numeric final-answer check; `format_reward` and `require_format` as in the module docstring."""

    reference_is_data = True  # a number compared with, never run

    def __init__(
        self, format_reward: float = 0.0, require_format: bool = False, rel_tol: Fraction = REL_TOL
    ) -> None:
        if not 0.0 <= format_reward < 1.0:
            raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
        if not 0 <= rel_tol < 1:
            raise ValueError(f"rel_tol must be in [0, 1), got {rel_tol}")
        self.format_reward = format_reward
        self.rel_tol = Fraction(rel_tol)
        self.require_format = require_format
        self.name = "math_strict" if require_format else "math"

    def verify(self, request: VerifyRequest) -> Outcome:
        if not isinstance(request.text, str) or not isinstance(request.reference, str):
            raise TypeError("text and reference must be strings")
        ref = reference_number(request.reference)
        if ref is None or ref.value is None:
            return ExecutionFault(
                request.sample_id,
                FaultKind.INPUT,
                f"{self.name}: reference {request.reference[-80:]!r} is not one number; give the problem "
                "a numeric reference (42, #### 42 or \\boxed{42}) or use another verifier",
                request.attempt,
            )
        return self._judge(request.sample_id, find_answer(request.text), ref)

    def _judge(self, sample_id: str, answer: Answer, ref: Number) -> Verdict:
        if answer.number is None:
            where = f"{answer.source} {answer.region[:40]!r} holds" if answer.formatted else "the text has"
            return Verdict(sample_id, 0.0, False, f"{where} no number; reference {ref.shown}")
        if self.require_format and not answer.formatted:
            return Verdict(
                sample_id,
                0.0,
                False,
                f"no \\boxed{{}} or #### answer (last number {answer.number.shown}); reference {ref.shown}",
            )
        correct = same_number(answer.number, ref, self.rel_tol)
        reward = 1.0 if correct else (self.format_reward if answer.formatted else 0.0)
        relation = "matches" if correct else "differs from"
        detail = f"answer {answer.number.shown} (from {answer.source}) {relation} reference {ref.shown}"
        return Verdict(sample_id, reward, correct, detail)

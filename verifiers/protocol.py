"""What a verifier takes and returns.

A verifier gets a sample's text and the problem's reference and returns one of two typed outcomes:
a `Verdict` (the answer was judged; its reward, right or wrong) or an `ExecutionFault` (the verifier
itself could not judge: it crashed, timed out, or ran out of resources). A fault is retried by
whoever dispatched the work and is never turned into a zero reward: scoring a crashed verifier as a
wrong answer teaches the policy that correct answers are bad.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


@dataclass(frozen=True)
class VerifyRequest:
    sample_id: str
    text: str
    reference: str
    attempt: int = 0


@dataclass(frozen=True)
class Verdict:
    """The answer was judged. `reward` is in [0, 1]; `correct` says whether it matched exactly."""

    sample_id: str
    reward: float
    correct: bool
    detail: str = ""


class FaultKind(StrEnum):
    CRASH = "crash"  # the verifier raised or its process died
    TIMEOUT = "timeout"  # it did not answer in time (and was stopped)
    RESOURCES = "resources"  # out of memory, no device, sandbox refused


@dataclass(frozen=True)
class ExecutionFault:
    """The verifier could not judge the answer. Retry; never score it."""

    sample_id: str
    kind: FaultKind
    detail: str
    attempt: int = 0


Outcome = Verdict | ExecutionFault


class Verifier(Protocol):
    name: str

    def verify(self, request: VerifyRequest) -> Outcome: ...


def run_verifier(verifier: Verifier, request: VerifyRequest) -> Outcome:
    """Call a verifier in-process; an exception becomes an `ExecutionFault`, never a zero reward."""
    try:
        return verifier.verify(request)
    except MemoryError as err:
        return ExecutionFault(
            request.sample_id, FaultKind.RESOURCES, f"{verifier.name}: {err!r}", request.attempt
        )
    except Exception as err:  # noqa: BLE001 - the boundary where any verifier bug becomes a typed fault
        return ExecutionFault(
            request.sample_id, FaultKind.CRASH, f"{verifier.name}: {err!r}", request.attempt
        )


def fenced_code(text: str, languages: tuple[str, ...]) -> str:
    """The first fenced block (```lang ... ```) whose tag is one of `languages` or empty; else the
    whole text. Models often wrap their code in prose; the verifier judges the code."""
    tags = "|".join(re.escape(lang) for lang in languages)
    found = re.search(rf"```(?:{tags})?\s*\n(.*?)```", text, re.DOTALL)
    return found.group(1) if found else text

"""What a verifier takes and returns.

A verifier gets a sample's text and the problem's reference and returns one of two typed outcomes:
a `Verdict` (the answer was judged; its reward, right or wrong) or an `ExecutionFault` (the verifier
itself could not judge: it crashed, timed out, or ran out of resources). A fault is retried by
whoever dispatched the work and is never turned into a zero reward: scoring a crashed verifier as a
wrong answer teaches the policy that correct answers are bad.
"""

from __future__ import annotations

import re
from collections.abc import Callable
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
    INPUT = "input"  # the sample cannot be judged as given (no reference, no such verifier kind)

    @property
    def retryable(self) -> bool:
        """A retry may succeed: not for bad input, which judges the same way every time."""
        return self is not FaultKind.INPUT


@dataclass(frozen=True)
class ExecutionFault:
    """The verifier could not judge the answer. Retry; never score it."""

    sample_id: str
    kind: FaultKind
    detail: str
    attempt: int = 0


Outcome = Verdict | ExecutionFault


@dataclass(frozen=True)
class Prepared:
    """A two-stage verifier's CPU stage is done; `payload` (a compiled binary, say) goes to its GPU
    stage, which runs on a worker holding a device of its own."""

    sample_id: str
    payload: bytes
    detail: str = ""


class Verifier(Protocol):
    name: str

    def verify(self, request: VerifyRequest) -> Outcome: ...


class TwoStageVerifier(Verifier, Protocol):
    """A verifier whose work splits into a CPU stage and a GPU stage (e.g. compile, then run). With
    GPU workers in the pool the stages run on different workers; without, `verify` runs both."""

    def prepare(self, request: VerifyRequest) -> Outcome | Prepared: ...

    def run_prepared(self, request: VerifyRequest, payload: bytes) -> Outcome: ...


def is_two_stage(verifier: Verifier) -> bool:
    return callable(getattr(verifier, "prepare", None)) and callable(getattr(verifier, "run_prepared", None))


def run_stage(
    verifier: Verifier, request: VerifyRequest, call: Callable[[], Outcome | Prepared]
) -> Outcome | Prepared:
    """One stage of a two-stage verifier, with `run_verifier`'s guarantees: a missing reference is an
    INPUT fault, an exception an `ExecutionFault`, never a zero reward."""
    if (fault := missing_reference(verifier, request)) is not None:
        return fault
    try:
        return call()
    except MemoryError as err:
        return ExecutionFault(
            request.sample_id, FaultKind.RESOURCES, f"{verifier.name}: {err!r}", request.attempt
        )
    except Exception as err:  # noqa: BLE001 - the boundary where any verifier bug becomes a typed fault
        return ExecutionFault(
            request.sample_id, FaultKind.CRASH, f"{verifier.name}: {err!r}", request.attempt
        )


def missing_reference(verifier: Verifier, request: VerifyRequest) -> ExecutionFault | None:
    """An INPUT fault when the sample has no reference to judge against (None or blank) and the
    verifier needs one; a verifier that judges without one sets `needs_reference = False`."""
    if not getattr(verifier, "needs_reference", True):
        return None
    if isinstance(request.reference, str) and request.reference.strip():
        return None
    return ExecutionFault(
        request.sample_id,
        FaultKind.INPUT,
        f"{verifier.name}: sample {request.sample_id} has no reference to judge against; give its "
        "problem a non-empty 'reference' (or use a verifier with needs_reference = False)",
        request.attempt,
    )


def run_verifier(verifier: Verifier, request: VerifyRequest) -> Outcome:
    """Call a verifier in-process; an exception becomes an `ExecutionFault`, never a zero reward,
    and a sample without a reference an INPUT fault without calling the verifier at all."""
    out = run_stage(verifier, request, lambda: verifier.verify(request))
    assert not isinstance(out, Prepared)
    return out


def fenced_code(text: str, languages: tuple[str, ...]) -> str:
    """The first fenced block (```lang ... ```) whose tag is one of `languages` or empty; else the
    whole text. Models often wrap their code in prose; the verifier judges the code."""
    tags = "|".join(re.escape(lang) for lang in languages)
    found = re.search(rf"```(?:{tags})?\s*\n(.*?)```", text, re.DOTALL)
    return found.group(1) if found else text
